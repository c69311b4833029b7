"""DeepSeek-YaRN's softmax scale: the part of DeepSeek's YaRN that lives in the attention, not in the rotary module.

DeepSeek V2/V3 (and Mistral 4, GLM-4-MoE-Lite, ... in transformers) multiply cos/sin by the rotary ratio
m(s, mscale) / m(s, mscale_all_dim) (methods._yarn_attention_factor) AND the softmax scale by m(s, mscale_all_dim)^2,
with m(s, x) = 0.1 x ln s + 1 for s > 1, else 1. transformers sets the second in each attention module's `scaling`
(`self.scaling = yarn_apply_mscale(config.rope_parameters, qk_head_dim ** -0.5)`, e.g. models/deepseek_v3), for every
rope_type but `default` whose `mscale_all_dim` is set. An attention class "computes scaling this way" when the module
that defines it defines `yarn_apply_mscale` and the instance holds a float `scaling`.

While a method is applied ctxeval sets each such module's `scaling` to base x softmax_factor(method), the base being
the shipped `scaling` divided by the shipped config's own factor, and puts the shipped value back on exit. A yarn with
`mscale_all_dim` on a model without such modules is refused: its attention has no place for the term.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from ..errors import CtxevalError

READBACK_RTOL = 1e-12  # a Python float written and read back: equal, unless something else changed it


def _m(scale: float, x: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * x * math.log(scale) + 1.0


def softmax_factor(method: str, params: dict[str, Any]) -> float:
    """The factor on the attention's softmax scale that `method` with `params` asks for: m(s, mscale_all_dim)^2 for a
    yarn (static: `factor`) with mscale_all_dim set, else 1 (plain RoPE, and every other method, keep the base)."""
    if method != "yarn" or not params.get("mscale_all_dim"):
        return 1.0
    return _m(float(params["factor"]), float(params["mscale_all_dim"])) ** 2


def shipped_factor(rope_parameters: Any) -> float:
    """The factor transformers' yarn_apply_mscale put into `scaling` from the checkpoint's rope_parameters."""
    if not isinstance(rope_parameters, dict) or rope_parameters.get("rope_type", "default") == "default":
        return 1.0
    if not rope_parameters.get("mscale_all_dim"):
        return 1.0
    return _m(float(rope_parameters["factor"]), float(rope_parameters["mscale_all_dim"])) ** 2


def deepseek_attentions(model: Any) -> list[tuple[str, Any]]:
    """Every attention module whose class sets `scaling` by DeepSeek's yarn_apply_mscale."""
    found = []
    for name, module in model.named_modules():
        home = sys.modules.get(type(module).__module__)
        if getattr(home, "yarn_apply_mscale", None) is not None and isinstance(getattr(module, "scaling", None), float):
            found.append((name, module))
    return found


class SoftmaxScale:
    """DeepSeek's softmax term applied to a model's attention modules; `restore` puts the shipped values back."""

    def __init__(self, model: Any, method: str, params: dict[str, Any]) -> None:
        self.factor = softmax_factor(method, params)
        self.modules = deepseek_attentions(model)
        if self.factor != 1.0 and not self.modules:
            attention = next((type(m).__name__ for n, m in model.named_modules() if n.endswith("self_attn")), "its")
            raise CtxevalError(
                f"yarn with mscale_all_dim scales the softmax by m(s, mscale_all_dim)^2 = {self.factor:.4g}, which only "
                f"DeepSeek-style attention (DeepseekV2/V3, Mistral 4) applies, and this model's {attention} attention "
                "cannot take it; drop mscale_all_dim (and mscale), or use a DeepSeek-style model"
            )
        config = getattr(model, "config", None) if self.modules else None
        shipped = shipped_factor(getattr(config.get_text_config(), "rope_parameters", None)) if config else 1.0
        self.saved = [(module, module.scaling) for _, module in self.modules]
        self.base = [value / shipped for _, value in self.saved]
        self.readback: list[float] = []

    def apply(self) -> "SoftmaxScale":
        for (module, _), base in zip(self.saved, self.base):
            module.scaling = base * self.factor
        self.readback = [float(module.scaling) for _, module in self.modules]
        for (name, _), got, base in zip(self.modules, self.readback, self.base):
            if not math.isclose(got, base * self.factor, rel_tol=READBACK_RTOL):
                self.restore()
                raise CtxevalError(f"'{name}'.scaling reads {got!r} after ctxeval set {base * self.factor!r}")
        return self

    def restore(self) -> None:
        for module, value in self.saved:
            module.scaling = value

    def record(self) -> dict[str, Any]:
        """What run.json records: the factor asked for, and `scaling` read back from every module (once per value)."""
        if not self.modules:
            return {}
        return {
            "softmax_scale_factor": self.factor,
            "softmax_scale_readback": sorted({s / b for s, b in zip(self.readback, self.base)}),
            "softmax_scaling_readback": sorted(set(self.readback)),
            "softmax_scale_modules": len(self.modules),
        }
