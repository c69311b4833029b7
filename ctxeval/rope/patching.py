"""Apply a RoPE method to a loaded model in place, read the effective RoPE back, restore it.

With attention.py (the attention side), the only module that touches transformers internals. A transformers rotary
module (LlamaRotaryEmbedding and its many copies) holds an `inv_freq` buffer and an `attention_scaling` float, and its forward returns
cos/sin = cos(pos * inv_freq) * attention_scaling, sin(...) * attention_scaling. We overwrite both and set its
`rope_type` to "default" so that transformers' own stateful dynamic update (which only recomputes when a LONGER
sequence arrives, so results depend on sample order) never runs. Length-dependent methods get a forward pre-hook
that recomputes the frequencies from each forward's own length: no state survives between samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import CtxevalError
from .geometry import rope_info_from_config
from .methods import START_TOKENS, Geometry, Method, RopeFreqs, compute, get_method, resolve_params
from .softmax_scale import SoftmaxScale

READBACK_RTOL = 1e-5  # cos/sin are float32; the angle at position 1 is read back to ~1e-7 relative
START_TOKENS_ATOL = 1e-4  # cos/sin at positions up to 256 (float32 angles there are good to ~3e-5)


def find_rotary_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every rotary-embedding module: the model-level one (Llama style) and per-layer ones (older models)."""
    found = []
    for name, module in model.named_modules():
        if hasattr(module, "inv_freq") or (
            "Rotary" in type(module).__name__
            and any(n.endswith("inv_freq") for n, _ in module.named_buffers(recurse=False))
        ):
            found.append((name, module))
    return found


def _check_supported(name: str, module: torch.nn.Module) -> None:
    if not hasattr(module, "inv_freq") or not hasattr(module, "attention_scaling"):
        raise CtxevalError(
            f"{type(module).__name__} ('{name}') is not a transformers-style rotary module (inv_freq + "
            "attention_scaling); ctxeval cannot patch it: use --method none"
        )


@dataclass
class _Saved:
    inv_freq: torch.Tensor
    attention_scaling: float
    rope_type: Any
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Readback:
    """RoPE as the model's rotary module actually produces it, decoded from its cos/sin output."""

    inv_freq: np.ndarray  # (d/2,) from the angle at position 1
    attention_factor: float  # cos at position 0

    def max_rel_diff(self, expected: RopeFreqs) -> float:
        rel = np.abs(self.inv_freq - expected.inv_freq) / expected.inv_freq
        return float(max(rel.max(), abs(self.attention_factor - expected.attention_factor) / expected.attention_factor))


class RopeHandle:
    """A method applied to a model in place. Also a context manager that restores the original RoPE on exit."""

    def __init__(
        self,
        model: torch.nn.Module,
        method: Method,
        params: dict[str, Any],
        geometry: Geometry,
        modules: list[tuple[str, torch.nn.Module]],
    ) -> None:
        self.model = model
        self.method = method
        self.params = params
        self.geometry = geometry
        self.modules = modules
        self._saved: list[_Saved] = []
        self._on_device: dict[tuple[int, Any, Any], torch.Tensor] = {}  # written frequencies, per RopeFreqs
        self._hooks: list[Any] = []
        self._frozen_length: int | None = None
        self._cache: dict[int | None, RopeFreqs] = {}
        self.softmax: SoftmaxScale | None = None  # DeepSeek-style attention's softmax scale (softmax_scale.py)
        self.active = False
        # LongRoPE's mixed embedding: positions < start_tokens get plain RoPE's cos/sin (a forward hook)
        self.start_tokens = int(params.get(START_TOKENS) or 0)
        self._start_suspended = False
        self.start_tokens_max_abs_diff: float | None = None

    # -- expected values (methods.py) ----------------------------------------------------------------------------
    def expected(self, length: int | None = None) -> RopeFreqs:
        """What methods.py says the RoPE is at sequence length `length` (ignored by static methods)."""
        key = length if self.method.length_dependent else None
        if key not in self._cache:
            self._cache[key] = compute(self.method, self.geometry, self.params, key)
        return self._cache[key]

    @property
    def inv_freq(self) -> np.ndarray:
        return self.expected().inv_freq

    @property
    def attention_factor(self) -> float:
        return self.expected().attention_factor

    # -- apply / restore ---------------------------------------------------------------------------------------
    def _write(self, module: torch.nn.Module, freqs: RopeFreqs) -> None:
        buf = module.inv_freq
        key = (id(freqs), buf.device, buf.dtype)
        new = self._on_device.get(key)
        if new is None:  # a dynamic method writes on every forward: one host-to-device copy per length, not per call
            new = torch.from_numpy(freqs.inv_freq).to(device=buf.device, dtype=buf.dtype)
            self._on_device[key] = new
        if new.shape != buf.shape:
            raise CtxevalError(
                f"rotary module has {buf.numel()} frequencies but the geometry gives {new.numel()} "
                f"(rotary dim {self.geometry.rotary_dim}); the config's head_dim/partial_rotary_factor disagree with the model"
            )
        buf.copy_(new)
        module.attention_scaling = freqs.attention_factor

    def _pre_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if self._frozen_length is not None:
            length = self._frozen_length
        else:
            position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
            if position_ids is None:
                raise CtxevalError(
                    f"{type(module).__name__} was called without position_ids; cannot apply a dynamic method"
                )
            length = int(position_ids.max()) + 1
        self._write(module, self.expected(length))

    def _start_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        """microsoft/LongRoPE's MixedLongRoPEScaledRotaryEmbedding: cos/sin of positions < start_tokens replaced by
        plain RoPE's (the model's own frequencies, attention factor 1), computed by the module itself."""
        if self._start_suspended:
            return None
        position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if position_ids is None or not (isinstance(output, tuple) and len(output) == 2):
            raise CtxevalError(
                f"{START_TOKENS} needs a rotary module called with position_ids that returns cos, sin; "
                f"{type(module).__name__} does not: leave {START_TOKENS} at 0 for this model"
            )
        keep = position_ids < self.start_tokens  # (batch, seq)
        if not bool(keep.any()):
            return None
        plain_cos, plain_sin = self._plain_output(module, args, kwargs)
        cos, sin = output  # (batch, seq, rotary_dim) each
        mask = keep[..., None].to(cos.device)  # (batch, seq, 1)
        return torch.where(mask, plain_cos, cos), torch.where(mask, plain_sin, sin)

    def _plain_output(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The module's cos/sin with plain RoPE written in for one call (forward itself: no hook runs again)."""
        plain = torch.from_numpy(self.geometry.default_inv_freq()).to(module.inv_freq.device, module.inv_freq.dtype)
        scaled, scaling = module.inv_freq.detach().clone(), module.attention_scaling
        with torch.no_grad():
            module.inv_freq.copy_(plain)
            module.attention_scaling = 1.0
            try:
                return module.forward(*args, **kwargs)
            finally:
                module.inv_freq.copy_(scaled)
                module.attention_scaling = scaling

    def verify_start_tokens(self, length: int) -> float:
        """Positions 0, n - 1 (plain RoPE) and n (the method) of each module's output against float64 cos/sin: the
        largest absolute difference (above 1e-4 is an error: float32 angles up to n are good to ~1e-5)."""
        n = self.start_tokens
        freqs = self.expected(length)
        plain = self.geometry.default_inv_freq()  # (d/2,)
        # the last probe sets the sequence length a length-dependent method sees; its float32 angle is too coarse to
        # compare (up to `length` radians)
        probes = [0, n - 1, n, max(length - 1, n)]
        worst = 0.0
        with torch.no_grad():
            for name, module in self.modules:
                device = module.inv_freq.device
                x = torch.zeros(1, len(probes), self.geometry.rotary_dim, device=device, dtype=torch.float32)
                cos, sin = module(x, torch.tensor([probes], device=device))  # (1, 4, rotary_dim) each
                for row, position in enumerate(probes[:3]):
                    inv, scale = (plain, 1.0) if position < n else (freqs.inv_freq, freqs.attention_factor)
                    got_cos = cos[0, row].double().cpu().numpy()  # (rotary_dim,)
                    got_sin = sin[0, row].double().cpu().numpy()
                    diff = min(  # rotate-half or interleaved layout, whichever the module has
                        max(
                            float(np.abs(got_cos - scale * np.cos(position * layout)).max()),
                            float(np.abs(got_sin - scale * np.sin(position * layout)).max()),
                        )
                        for layout in (np.concatenate([inv, inv]), np.repeat(inv, 2))
                    )
                    worst = max(worst, diff)
                    if not diff <= START_TOKENS_ATOL:
                        self.restore()
                        raise CtxevalError(
                            f"'{name}' at position {position:,} differs from {self.method.name} with {START_TOKENS}="
                            f"{n} by {diff:.2e}: the model does not use the RoPE ctxeval wrote; please report this model"
                        )
        return worst

    def apply(self) -> "RopeHandle":
        self.softmax = SoftmaxScale(self.model, self.method.name, self.params)  # refuses before anything changes
        with torch.no_grad():
            for _, module in self.modules:
                self._saved.append(
                    _Saved(
                        module.inv_freq.detach().clone(),
                        module.attention_scaling,
                        getattr(module, "rope_type", None),
                        {k: getattr(module, k) for k in ("max_seq_len_cached",) if hasattr(module, k)},
                    )
                )
                module.rope_type = "default"  # switch off transformers' stateful dynamic/longrope update
                if module.inv_freq.dtype != torch.float32:
                    # a model cast after loading (model.to(bfloat16)) casts the buffer too: bf16 frequencies are off by
                    # up to 0.4%, more than the read-back allows. transformers computes cos/sin in float32 anyway, so
                    # the buffer is float32 while a method is applied; restore puts the original tensor back.
                    module.inv_freq = module.inv_freq.float()
                self._write(module, self.expected(self.geometry.original_length))
                if self.method.length_dependent:
                    self._hooks.append(module.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
                if self.start_tokens:
                    self._hooks.append(module.register_forward_hook(self._start_hook, with_kwargs=True))
        self.active = True
        try:
            self.softmax.apply()
            self.verify()
        except BaseException:  # a read-back that cannot even be decoded leaves the model as it was, too
            self.restore()
            raise
        return self

    def restore(self) -> None:
        """Put back the exact RoPE the model had before `apply` (buffers, attention scaling, rope_type)."""
        if not self.active:
            return
        for hook in self._hooks:
            hook.remove()
        if self.softmax is not None:
            self.softmax.restore()
        with torch.no_grad():
            for (_, module), saved in zip(self.modules, self._saved):
                if module.inv_freq.dtype == saved.inv_freq.dtype:
                    module.inv_freq.copy_(saved.inv_freq)
                else:  # upcast by apply: the original buffer itself, dtype and bits
                    module.inv_freq = saved.inv_freq
                module.attention_scaling = saved.attention_scaling
                module.rope_type = saved.rope_type
                for k, v in saved.extra.items():
                    setattr(module, k, v)
        self._hooks, self._saved = [], []
        self.active = False

    def __enter__(self) -> "RopeHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    def freeze_length(self, length: int | None) -> None:
        """Dynamic methods: use the frequencies of `length` for every forward (e.g. prompt + generated tokens) until
        unfrozen with None, so that cached keys and new queries share one RoPE during generation."""
        self._frozen_length = length

    # -- read back ------------------------------------------------------------------------------------------------
    def readback(self, length: int | None = None) -> list[Readback]:
        """Decode each rotary module's effective RoPE from its forward output at positions 0 and 1 (and length-1,
        which sets the sequence length seen by dynamic methods)."""
        out = []
        n = length or self.geometry.original_length
        suspended, self._start_suspended = self._start_suspended, True  # the start tokens: verify_start_tokens
        try:
            self._readback_into(out, n)
        finally:
            self._start_suspended = suspended
        return out

    def _readback_into(self, out: list[Readback], n: int) -> None:
        with torch.no_grad():
            for _, module in self.modules:
                device = module.inv_freq.device
                position_ids = torch.tensor([[0, 1, max(n - 1, 1)]], device=device)
                x = torch.zeros(1, 3, self.geometry.rotary_dim, device=device, dtype=torch.float32)
                result = module(x, position_ids)
                if torch.is_tensor(result) and result.is_complex():  # Llama 4: one complex factor per pair
                    result = (result.real.repeat(1, 1, 2), result.imag.repeat(1, 1, 2))  # as rotate-half cos, sin
                cos, sin = result  # (1, 3, rotary_dim) each
                cos, sin = cos[0].double().cpu().numpy(), sin[0].double().cpu().numpy()
                attention = float(cos[0, 0])
                angles = np.arctan2(sin[1], cos[1])  # (rotary_dim,) = inv_freq per channel, since inv_freq <= 1 < pi
                half = len(angles) // 2
                if np.allclose(angles[:half], angles[half:], rtol=1e-6, atol=0):
                    pairs = angles[:half]  # rotate-half layout: cat(freqs, freqs)
                elif np.allclose(angles[0::2], angles[1::2], rtol=1e-6, atol=0):
                    pairs = angles[0::2]  # interleaved layout
                else:
                    raise CtxevalError(f"cannot decode the cos/sin layout of {type(module).__name__}")
                out.append(Readback(pairs, attention))

    def verify(self, lengths: tuple[int, ...] | None = None) -> float:
        """Read back and compare with methods.py; a mismatch is an error, never silent. Returns the max rel diff."""
        if lengths is None:
            L = self.geometry.original_length
            lengths = (L, 2 * L, 8 * L) if self.method.length_dependent else (L,)
        worst = 0.0
        for length in lengths:
            expected = self.expected(length)
            for (name, _), rb in zip(self.modules, self.readback(length)):
                diff = rb.max_rel_diff(expected)
                worst = max(worst, diff)
                if not diff <= READBACK_RTOL:
                    self.restore()
                    raise CtxevalError(
                        f"RoPE read back from '{name}' differs from {self.method.name} by {diff:.2e} (relative) at "
                        f"length {length}: the model does not use the frequencies ctxeval wrote; please report this model"
                    )
            if self.start_tokens:
                diff = self.verify_start_tokens(length)
                self.start_tokens_max_abs_diff = max(self.start_tokens_max_abs_diff or 0.0, diff)
        if self.method.length_dependent and self._frozen_length is None:
            self._write_all(self.expected(self.geometry.original_length))
        return worst

    def _write_all(self, freqs: RopeFreqs) -> None:
        with torch.no_grad():
            for _, module in self.modules:
                self._write(module, freqs)

    def record(self, lengths: tuple[int, ...] = ()) -> dict[str, Any]:
        """What the run record stores: parameters, expected and read-back RoPE (per length for dynamic methods)."""
        points = sorted(set(lengths)) if self.method.length_dependent and lengths else [None]
        effective = []
        for length in points:
            exp = self.expected(length)
            rb = self.readback(length)[0]
            effective.append(
                {
                    "length": length,
                    "attention_factor": exp.attention_factor,
                    "attention_factor_readback": rb.attention_factor,
                    "inv_freq": exp.inv_freq.tolist(),
                    "inv_freq_readback": rb.inv_freq.tolist(),
                    "max_rel_diff": rb.max_rel_diff(exp),
                }
            )
        if self.method.length_dependent and self._frozen_length is None:
            self._write_all(self.expected(self.geometry.original_length))
        return {
            "method": self.method.name,
            "params": self.params,
            "length_dependent": self.method.length_dependent,
            "geometry": {
                "rotary_dim": self.geometry.rotary_dim,
                "base": self.geometry.base,
                "original_length": self.geometry.original_length,
            },
            "rotary_modules": [name for name, _ in self.modules],
            "effective": effective,
            **(
                {"start_tokens": {"n": self.start_tokens, "max_abs_diff": self.start_tokens_max_abs_diff}}
                if self.start_tokens
                else {}
            ),
            **(self.softmax.record() if self.softmax is not None else {}),
        }


def apply_method(
    model: torch.nn.Module, method: str | Method, geometry: Geometry | None = None, **params: Any
) -> RopeHandle:
    """Apply `method` (a Method, or its name) with `params` to `model` in place; returns a handle (also a context
    manager that restores).

    `geometry` defaults to the one read from the model's config. Method `none` on a model without RoPE is allowed
    (a no-op handle); any other method there is an error.
    """
    m = get_method(method) if isinstance(method, str) else method
    full = resolve_params(m, params)
    if m.name == "native":
        return _NativeHandle(model, m, full)
    if geometry is None:
        geometry = rope_info_from_config(model.config).geometry
    modules = find_rotary_modules(model)
    per_layer = [
        name
        for name, mod in modules
        if isinstance(getattr(mod, "rope_type", None), dict) or getattr(mod, "layer_types", None)
    ]
    if per_layer:
        if m.name == "none":
            return _NoRopeHandle(
                model, m, full, note="per-layer-type RoPE (Gemma 3 style) left as the checkpoint ships it"
            )
        raise CtxevalError(
            f"this model uses a different RoPE per attention layer type ('{per_layer[0]}', Gemma 3 style); ctxeval "
            "cannot apply extension methods to it yet: use --method none"
        )
    if geometry is None or not modules:
        if m.name == "none":
            return _NoRopeHandle(model, m, full)
        why = "its config has no RoPE parameters" if geometry is None else "no rotary embedding module was found in it"
        raise CtxevalError(f"method '{m.name}' needs a RoPE model, but {why}; use --method none for this model")
    for name, module in modules:
        _check_supported(name, module)
    return RopeHandle(model, m, full, geometry, modules).apply()


class _NoRopeHandle(RopeHandle):
    """`none` on a model without RoPE (learned positions, ALiBi): nothing to patch, nothing to read back."""

    def __init__(
        self, model: torch.nn.Module, method: Method, params: dict[str, Any], note: str = "model has no RoPE"
    ) -> None:
        super().__init__(model, method, params, Geometry(2, math.e, 1), [])
        self.note = note
        self.active = True

    def verify(self, lengths: tuple[int, ...] | None = None) -> float:
        return 0.0

    def record(self, lengths: tuple[int, ...] = ()) -> dict[str, Any]:
        return {
            "method": "none",
            "params": {},
            "length_dependent": False,
            "geometry": None,
            "rotary_modules": [],
            "effective": [],
            "note": self.note,
        }

    def restore(self) -> None:
        self.active = False


class _NativeHandle(RopeHandle):
    """`native`: the checkpoint's RoPE exactly as shipped. Nothing is written; the record holds the shipped rope
    parameters and the RoPE read back from each rotary module's output at the original length."""

    def __init__(self, model: torch.nn.Module, method: Method, params: dict[str, Any]) -> None:
        info = rope_info_from_config(model.config)
        modules = [
            (n, m) for n, m in find_rotary_modules(model) if hasattr(m, "inv_freq") and hasattr(m, "attention_scaling")
        ]
        super().__init__(model, method, params, info.geometry or Geometry(2, math.e, 1), modules)
        self.info = info
        self.active = True

    def verify(self, lengths: tuple[int, ...] | None = None) -> float:
        return 0.0

    def restore(self) -> None:
        self.active = False

    def record(self, lengths: tuple[int, ...] = ()) -> dict[str, Any]:
        effective = []
        if self.modules and self.info.geometry is not None:
            rb = self.readback(self.geometry.original_length)[0]
            effective.append(
                {
                    "length": self.geometry.original_length,
                    "attention_factor_readback": rb.attention_factor,
                    "inv_freq_readback": rb.inv_freq.tolist(),
                }
            )
        return {
            "method": "native",
            "params": {},
            "length_dependent": None,
            "rotary_modules": [n for n, _ in self.modules],
            "shipped_rope_parameters": self.info.shipped,
            "effective": effective,
            "note": "the checkpoint's own RoPE, untouched",
        }
