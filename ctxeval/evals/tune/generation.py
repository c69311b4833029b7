"""tune's held-out check by generation (`--passkey N`): the YaRN repo's passkey test at the target length for the
winner and what it is compared with, as an ordinary passkey run (`ctxeval passkey --protocol yarn`'s prompts, scoring,
rows and run.json) in the tune run's directory. Perplexity rewards a method that predicts the next token of prose;
a passkey at the target length asks whether the far context is still used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import CtxevalError
from ...models.load import LoadedModel
from ...runs.store import RunStore
from ...specs import MethodSpec
from ..common import Progress
from ..needle import NeedleConfig, sweep
from ..passkey import YARN_LENGTH_STEP, YARN_MAX_NEW_TOKENS, YarnPasskeyBuilder, YarnPasskeyRunner

SOURCE = "jquesnelle/yarn eval/passkey.py (from epfml/landmark-attention llama/run_test.py)"


def passkey_dir(run_dir: Path, heldout_name: str) -> Path:
    """`passkey-trial-214/` beside `heldout-trial-214/`: the check of that held-out run's methods."""
    return Path(run_dir) / ("passkey-" + heldout_name.removeprefix("heldout-"))


def check_passkey_length(lm: LoadedModel, target: int, seed: int) -> None:
    """A target too short for the passkey prompt is refused before the search (one line, exit 2)."""
    shortest = YarnPasskeyBuilder(lm.tokenizer, seed=seed).minimum_length()
    if target < shortest:
        raise CtxevalError(
            f"--passkey: the passkey prompt without filler takes {shortest - 1} tokens, more than the target "
            f"{target:,}; leave --passkey out or give a longer --target-length"
        )


def measure_passkey(
    lm: LoadedModel,
    model: str,
    specs: list[MethodSpec],
    target: int,
    samples: int,
    seed: int,
    run_dir: Path,
    progress: Progress,
) -> None:
    """`samples` passkey prompts at `target` tokens per method (the same keys and positions for every method), greedy
    replies of at most 10 tokens scored as the repo scores them; resumed like any passkey run."""
    builder = YarnPasskeyBuilder(lm.tokenizer, seed=seed, bos=False)  # the repo's prompts: no BOS added
    cfg = NeedleConfig(
        (target,), (0.0,), samples=samples, max_new_tokens=YARN_MAX_NEW_TOKENS, seed=seed, random_depth=True
    )
    runner = YarnPasskeyRunner(lm.model, lm.tokenizer, lm.device, builder, cfg, lm.name, "passkey", progress)
    garbage = builder.garbage_chars(target)
    spec = {
        "task": "passkey",
        "model": model,
        "preset": builder.preset.__dict__,
        "haystack": "filler",
        "text_field": "text",
        "lengths": [target],
        "depths": [0.0],
        "random_depth": True,
        "samples": samples,
        "scoring": "generate",
        "max_new_tokens": YARN_MAX_NEW_TOKENS,
        "snap": "sentence",
        "chat_template": False,
        "methods": [s.label for s in specs],
        "dtype": lm.dtype,
        "seed": seed,
        "protocol": "yarn",
        "bos": False,
        "length_step": YARN_LENGTH_STEP,
    }
    provenance: dict[str, Any] = {
        "model": lm.record(),
        "haystack": {"haystack": "filler"},
        "seed": seed,
        "scoring": {"name": "generate", "rule": "yarn: int(first \\d+) == key", "llm_judge": False},
        "protocol": {
            "name": "yarn",
            "source": SOURCE,
            "length_step": YARN_LENGTH_STEP,
            "bos": False,
            "bos_token": None,
            "garbage_chars": {str(target): garbage},
            "search_tokens": {str(target): builder.search_tokens(garbage)},
        },
        "check_of": Path(run_dir).parent.name,
    }
    with RunStore(run_dir, spec) as store:
        store.start({**provenance, "methods": store.record.get("methods", {})})
        try:
            sweep(lm, specs, runner, store)
        except BaseException as exc:
            store.finish("interrupted" if isinstance(exc, KeyboardInterrupt) else "error", str(exc)[:300])
            raise
        store.finish("success")
