"""Query temperature: a static factor on q per query position, applied before the model's own attention function
(the query-scale kernel), and the read-back that measures the factor a loaded model really applies.

  qscale-llama4   Llama 4's attn_temperature_tuning (transformers models/llama4/modeling_llama4.py,
                  Llama4TextAttention): q x (1 + attn_scale * ln(floor((p + 1) / floor_scale) + 1)); Llama 4 applies
                  it on its no-RoPE layers only (layers=nope, the default here).
  qscale-mistral  Mistral's llama_4_scaling_beta (models/ministral3/modeling_ministral3.py,
                  get_llama_4_attn_scale): q x (1 + beta * ln(1 + floor(p / original))) on every layer (layers=all).
The two differ by one position: Llama 4 floors (p + 1) / floor_scale, Mistral p / original. Each is kept exactly:
Llama 4's first scaled query sits at p = floor_scale - 1, Mistral's at p = original.

layers: all | nope. nope = the attention layers whose RoPE is off (transformers marks them `use_rope` false: Llama 4,
SmolLM3); a model without such layers refuses layers=nope.

Read-back (`query_scale_record`): every attention layer's own forward is called on one token at chosen positions
(a stand-in cache says how many tokens came before, as Llama 4 reads its position from the cache, and position_ids
are passed, as Ministral3 reads them), and the q and the softmax scale handed to torch's
scaled_dot_product_attention are captured. RoPE rotates q, which keeps its norm (and an L2 q-norm after it, Llama 4's,
gives the same norm at every position), so ||q(p)|| / ||q(0)|| is the factor at p relative to position 0 (where every
form here is exactly 1); RoPE's own constant cos/sin factor cancels (the RoPE read-back records it). This measures
what the model does, whatever its config says: `-m native` on a Llama 4 or Ministral 3 checkpoint records the scale
transformers applies, beside the one its config ships.
"""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Iterator

from ..errors import CtxevalError

if TYPE_CHECKING:
    import torch

QUERY_SCALE_METHODS = ("qscale-llama4", "qscale-mistral")
LAYERS = ("all", "nope")
PROBE_SEED = 0


def llama4_scale(positions: torch.Tensor, attn_scale: float, floor_scale: int) -> torch.Tensor:
    """1 + attn_scale * ln(floor((p + 1) / floor_scale) + 1) per position p (float64)."""
    import torch

    p = positions.to(torch.float64)
    return 1.0 + attn_scale * torch.log(torch.floor((p + 1.0) / floor_scale) + 1.0)


def mistral_scale(positions: torch.Tensor, beta: float, original: int) -> torch.Tensor:
    """1 + beta * ln(1 + floor(p / original)) per position p (float64)."""
    import torch

    p = positions.to(torch.float64)
    return 1.0 + beta * torch.log(1.0 + torch.floor(p / original))


def is_query_scale(spec: Any) -> bool:
    return spec.name in QUERY_SCALE_METHODS


def original_of(spec: Any, original_length: int) -> int:
    """Mistral's `original` (default: the model's trained length)."""
    return int(spec.params.get("original") or original_length)


def spec_scale(spec: Any, positions: torch.Tensor, original_length: int) -> torch.Tensor:
    p = spec.params
    if spec.name == "qscale-llama4":
        return llama4_scale(positions, p["attn_scale"], p["floor_scale"])
    if spec.name == "qscale-mistral":
        return mistral_scale(positions, p["beta"], original_of(spec, original_length))
    raise ValueError(f"{spec.name} is not a query temperature")


def uses_rope(module: Any) -> bool:
    """Whether an attention module rotates q and k: False only where transformers marks the layer `use_rope` false."""
    return bool(getattr(module, "use_rope", True))


def applies_to(spec: Any, module: Any) -> bool:
    """Whether `spec` scales q in this attention module (None: any module)."""
    return spec.params.get("layers", "all") == "all" or module is None or not uses_rope(module)


def query_temperature(
    specs: tuple[Any, ...], positions: torch.Tensor, original_length: int, module: Any = None
) -> torch.Tensor | None:
    """The product of the query temperatures of `specs` that apply to `module` at `positions` (float64, same shape);
    None when none does."""
    factor = None
    for spec in specs:
        if is_query_scale(spec) and applies_to(spec, module):
            scale = spec_scale(spec, positions, original_length)
            factor = scale if factor is None else factor * scale
    return factor


def scale_query(
    module: Any, query: torch.Tensor, positions: torch.Tensor, specs: tuple[Any, ...], original_length: int
) -> torch.Tensor:
    """q (B, H, T, D) times its temperature at positions (B, T), in float32 then q's dtype (unchanged where none)."""
    import torch

    factor = query_temperature(specs, positions, original_length, module)
    if factor is None:
        return query
    return (query.float() * factor.to(torch.float32)[:, None, :, None]).to(query.dtype)


def first_scaled(modules: list[Any], specs: tuple[Any, ...]) -> Any:
    """The first of `modules` that every query temperature of `specs` applies to (the first module if none does)."""
    return next((m for m in modules if all(applies_to(s, m) for s in specs if is_query_scale(s))), modules[0])


def first_scaled_position(spec: Any, original_length: int) -> int | None:
    """The first position whose factor differs from 1 (a sequence up to it is unchanged: Llama 4's p + 1 reaches
    floor_scale at p = floor_scale - 1, Mistral's p reaches original at p = original); None for other methods."""
    if spec.name == "qscale-llama4":
        return int(spec.params["floor_scale"]) - 1
    if spec.name == "qscale-mistral":
        return original_of(spec, original_length)
    return None


def describe_query_scale(spec: Any, original_length: int) -> str | None:
    """One line for `ctxeval plan`: the formula with its numbers, where it starts, which layers; None for others."""
    first = first_scaled_position(spec, original_length)
    if first is None:
        return None
    p = spec.params
    formula = (
        f"1 + {p['attn_scale']:g} ln(floor((i+1)/{p['floor_scale']}) + 1)"
        if spec.name == "qscale-llama4"
        else f"1 + {p['beta']:g} ln(1 + floor(i/{original_of(spec, original_length)}))"
    )
    where = "every layer" if p["layers"] == "all" else "the layers whose RoPE is off"
    return f"{spec.name}: queries at position i scaled by {formula} on {where}; exactly 1 below i = {first:,}"


def check_query_scales(specs: tuple[Any, ...]) -> None:
    """One query temperature per spec, on the query-scale kernel (not with logn, nor with a remapping method)."""
    names = [s.name for s in specs if is_query_scale(s)]
    if not names:
        return
    if len(names) > 1 or len(specs) > 1:
        raise CtxevalError(
            f"{'+'.join(s.name for s in specs)}: a query temperature ({names[0]}) scales q alone, on the model's own "
            "attention; combine it with a frequency method only (not with another q scale, logn or a remapping "
            "method)"
        )


def nope_layers(model: Any) -> list[int]:
    """Indices of the attention modules whose RoPE is off (transformers' `use_rope` false)."""
    return [
        int(getattr(m, "layer_idx", i))
        for i, m in enumerate(attention_modules(model))
        if hasattr(m, "use_rope") and not uses_rope(m)
    ]


def check_query_scale_model(model: Any, specs: tuple[Any, ...]) -> None:
    """Refused in one line: a query temperature on a model that does not run sdpa (its read-back reads q at the sdpa
    call), and layers=nope on a model with no RoPE-free layer."""
    ours = [s.name for s in specs if is_query_scale(s)]
    impl = getattr(model.config.get_text_config(), "_attn_implementation", None)
    if ours and impl != "sdpa":
        raise CtxevalError(
            f"{ours[0]}: its q scale is read back at the sdpa call, and this model runs '{impl}'; rerun with --attn sdpa"
        )
    asked = [s.name for s in specs if is_query_scale(s) and s.params.get("layers") == "nope"]
    if asked and not nope_layers(model):
        raise CtxevalError(
            f"{asked[0]}: layers=nope scales the layers whose RoPE is off, and {type(model).__name__} has none "
            "(every layer rotates q and k); use layers=all"
        )


# ---------------------------------------------------------------------------------------------------------------
# read-back


def attention_modules(model: Any) -> list[Any]:
    """The decoder's attention modules in order: modules named *Attention* that know their layer index."""
    return [
        m
        for m in model.modules()
        if "attention" in type(m).__name__.lower() and isinstance(getattr(m, "layer_idx", None), int)
    ]


def shipped_query_scale(config: Any) -> dict[str, Any] | None:
    """The query temperature a checkpoint's config ships, as ctxeval's method would write it; None if none."""
    text = config.get_text_config()
    if getattr(text, "attn_temperature_tuning", False):
        return {
            "name": "qscale-llama4",
            "params": {"attn_scale": float(text.attn_scale), "floor_scale": int(text.floor_scale), "layers": "nope"},
        }
    rope = getattr(text, "rope_parameters", None) or {}
    beta = rope.get("llama_4_scaling_beta") if isinstance(rope, dict) else None
    if beta is not None:
        original = rope.get("original_max_position_embeddings") or text.max_position_embeddings
        return {"name": "qscale-mistral", "params": {"beta": float(beta), "original": int(original), "layers": "all"}}
    return None


def probe_positions(boundaries: list[int]) -> list[int]:
    """0, 1 and each boundary's neighbours and multiples (where a floor steps), sorted."""
    points = {0, 1}
    for b in boundaries:
        points |= {b - 2, b - 1, b, 2 * b - 1, 2 * b, 8 * b - 1}
    return sorted(p for p in points if p >= 0)


class PastLength:
    """A stand-in cache: `length` tokens came before (Llama 4 reads its positions from it); update keeps only the
    call's own keys and values (the probe reads q, not the attention output)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def update(self, key: Any, value: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return key, value


@contextlib.contextmanager
def capture_sdpa(seen: list[tuple[Any, Any]]) -> Iterator[None]:
    """Record (query, scale) of every torch scaled_dot_product_attention call inside the block."""
    import torch

    original = torch.nn.functional.scaled_dot_product_attention

    def spy(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((query.detach(), kwargs.get("scale")))
        return original(query, key, value, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


@contextlib.contextmanager
def kept_state(module: Any) -> Iterator[None]:
    """Put back a rotary module's buffers and number attributes on exit: a dynamic RoPE assigns itself new
    frequencies for the far positions probed (and records the length it saw), and the run must not inherit them."""
    if module is None:
        yield
        return
    buffers = dict(module.named_buffers(recurse=False))  # transformers' dynamic updates assign new tensors
    numbers = {k: v for k, v in vars(module).items() if isinstance(v, (int, float))}
    try:
        yield
    finally:
        for name, held in buffers.items():
            setattr(module, name, held)
        for k, v in numbers.items():
            setattr(module, k, v)


def measure_query_scale(model: Any, positions: list[int]) -> dict[str, Any]:
    """Per attention layer, the factor on q at each position relative to position 0 and the softmax scale times
    sqrt(head_dim), as handed to torch's sdpa (module docstring). Raises CtxevalError when it cannot be measured."""
    import torch

    from ..rope.patching import find_rotary_modules

    config = model.config.get_text_config()
    if getattr(config, "_attn_implementation", None) != "sdpa":
        raise CtxevalError(f"the q scale is read through sdpa; this model runs '{config._attn_implementation}'")
    modules = attention_modules(model)
    if not modules:
        raise CtxevalError(f"no attention module of {type(model).__name__} says which layer it is; none to probe")
    rotary = next(iter(find_rotary_modules(model)), (None, None))[1]
    weight = next(iter(model.parameters()))
    gen = torch.Generator().manual_seed(PROBE_SEED)
    hidden = torch.randn(1, 1, config.hidden_size, generator=gen).to(weight.device, weight.dtype)
    layers, softmax = [], set()
    seen: list[tuple[Any, Any]] = []
    with kept_state(rotary), torch.inference_mode(), capture_sdpa(seen):
        for module in modules:
            norms = []
            for p in positions:
                ids = torch.tensor([[p]], device=weight.device)
                embeddings = rotary(hidden, ids) if rotary is not None else None
                seen.clear()
                module(
                    hidden_states=hidden,
                    position_embeddings=embeddings,
                    attention_mask=None,
                    position_ids=ids,
                    cache=PastLength(p),
                )
                if len(seen) != 1:
                    raise CtxevalError(
                        f"{type(module).__name__} made {len(seen)} sdpa calls for one token; its q cannot be read"
                    )
                query, scale = seen[0]
                dim = query.shape[-1]
                norms.append(query[0].reshape(-1, dim).double().norm(dim=-1))  # (H,): one token (GQA may pack it)
                softmax.add(1.0 if scale is None else round(float(scale) * math.sqrt(dim), 12))
            per_head = torch.stack(norms) / norms[0]  # (positions, H)
            layers.append(
                {
                    "layer": int(module.layer_idx),
                    "q_scale": [round(v, 9) for v in per_head.mean(-1).tolist()],  # float32 noise is ~1e-8
                    "head_spread": float((per_head.max(-1).values - per_head.min(-1).values).max()),
                    "dtype": str(query.dtype).replace("torch.", ""),
                }
            )
    return {"positions": positions, "relative_to_position": 0, "layers": layers, "softmax_scale": sorted(softmax)}


def layer_ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> 'layers 0-2, 5'."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"layer{'s' if len(layers) > 1 else ''} {text}"


def summary(measured: dict[str, Any]) -> str:
    """One line of a read-back: per group of layers with the same factors, where q's factor leaves 1 and what it
    reaches at the last position probed; the softmax scales seen."""
    positions = measured["positions"]
    groups: dict[tuple[float, ...], list[int]] = {}
    for row in measured["layers"]:
        groups.setdefault(tuple(round(v, 5) for v in row["q_scale"]), []).append(row["layer"])
    parts = []
    for scales, layers in groups.items():
        first = next((i for i, v in enumerate(scales) if abs(v - 1) > 1e-5), None)
        parts.append(
            f"{layer_ranges(layers)}: q x1 at every position probed (0-{positions[-1]:,})"
            if first is None
            else f"{layer_ranges(layers)}: q x{scales[first]:.4g} from position {positions[first]:,} "
            f"(x1 at {positions[first - 1]:,}) to x{scales[-1]:.4g} at {positions[-1]:,}"
        )
    softmax = ", ".join(f"x{v:.6g}" for v in measured["softmax_scale"])
    return "; ".join(parts) + f"; softmax scale {softmax} of 1/sqrt(head_dim)"


def expected_scales(specs: tuple[Any, ...], module: Any, positions: list[int], original_length: int) -> list[float]:
    import torch

    factor = query_temperature(specs, torch.tensor(positions), original_length, module)
    return [1.0] * len(positions) if factor is None else factor.tolist()


def tolerance(dtype: str) -> float:
    """How far a measured q ratio may sit from the formula: float32 rounding, or 4 ulps of a half-precision q."""
    return {"bfloat16": 4 * 2.0**-8, "float16": 4 * 2.0**-11}.get(dtype, 1e-5)


def compare(measured: dict[str, Any], specs: tuple[Any, ...], model: Any, original_length: int) -> float:
    """The largest distance, over layers and positions, between the measured factors and `specs`' formulas, each
    relative to its dtype's tolerance (<= 1 agrees)."""
    modules = {int(m.layer_idx): m for m in attention_modules(model)}
    worst = 0.0
    for row in measured["layers"]:
        want = expected_scales(specs, modules[row["layer"]], measured["positions"], original_length)
        diff = max(abs(a - b) for a, b in zip(row["q_scale"], want))
        worst = max(worst, diff / tolerance(row["dtype"]))
    return worst


def query_scale_record(
    model: Any, specs: tuple[Any, ...], original_length: int, native: bool = False
) -> dict[str, Any] | None:
    """What run.json records of the q scale: measured at probe positions, with the formula it is compared to
    (`specs`' query temperatures, or under `native` the one the config ships). A measured scale that differs from
    ctxeval's own method is an error; under native the difference is recorded. None when there is nothing to read
    (not native, and no query temperature among `specs`)."""
    ours = tuple(s for s in specs if is_query_scale(s))
    if not ours and not native:
        return None
    check_query_scale_model(model, ours)
    shipped = shipped_query_scale(model.config) if native else None
    if native:
        compared = (SimpleNamespace(**shipped),) if shipped else ()
    else:
        compared = ours
    boundaries = [b for b in (first_scaled_position(s, original_length) for s in compared) if b]
    positions = probe_positions(boundaries + [original_length])
    try:
        measured = measure_query_scale(model, positions)
    except Exception as exc:  # noqa: BLE001 -- an attention module that cannot be called alone: recorded, or refused
        if not native:
            raise CtxevalError(f"{'+'.join(ours_name(ours))}: the q scale could not be read back: {exc}") from None
        return {"measured": False, "why": str(exc), "config_ships": shipped}
    worst = compare(measured, compared, model, original_length)
    record = {"summary": summary(measured), **measured}
    record["compared_to"] = [{"name": s.name, "params": dict(s.params)} for s in compared]
    record["max_diff_in_tolerances"] = worst
    if native:
        record["config_ships"] = shipped
        record["matches"] = worst <= 1.0
    elif worst > 1.0:
        raise CtxevalError(
            f"{'+'.join(ours_name(ours))}: the q scale read back from the model differs from the formula by "
            f"{worst:.1f} tolerances; the model does not apply what ctxeval set"
        )
    return record


def ours_name(specs: tuple[Any, ...]) -> list[str]:
    return [s.name for s in specs]
