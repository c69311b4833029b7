"""`ctxeval lm-eval`: lm-evaluation-harness tasks with each RoPE method applied in place and read back."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ..errors import CtxevalError
from ..models.load import DEFAULT_MODEL
from ..runs.store import RunStore
from ..specs import MethodSpec
from .console import err, print_outputs, user_errors
from .options import (
    BatchOpt,
    Check,
    Engine,
    FactorOpt,
    Load,
    MethodOpt,
    Omit,
    OutOpt,
    OverwriteOpt,
    PlainModelOpt,
    TasksOpt,
    reworded,
    with_blocks,
)
from .run import Measurement, method_specs

if TYPE_CHECKING:
    from ..evals.common import Progress


def extended_length(specs: list[MethodSpec], trained: int) -> int:
    """The longest context the methods extend to: trained length x the largest factor any of them sets."""
    factors = [float(s.params["factor"]) for s in specs if "factor" in s.params]
    return int(trained * max([1.0, *factors]))


@dataclass(frozen=True)
class LmEvalOptions:
    tasks: TasksOpt
    model: PlainModelOpt = None
    method: MethodOpt = None
    factor: FactorOpt = None
    include_path: Annotated[Optional[str], typer.Option(help="A folder of your own lm-eval task YAML files.")] = None
    limit: Annotated[
        Optional[float],
        typer.Option(help="Documents per task (lm-eval's --limit; < 1: a fraction)."),
        Check("--limit", above=0),
    ] = None
    num_fewshot: Annotated[
        Optional[int],
        typer.Option(help="Few-shot examples (lm-eval's --num_fewshot)."),
        Check("--num-fewshot", minimum=0),
    ] = None
    batch_size: reworded(BatchOpt, "lm-eval's batch size.") = 1
    max_length: Annotated[
        Optional[int],
        typer.Option(
            help="Tokens lm-eval keeps of each input (it cuts from the "
            "left; default: trained length x the largest --factor)."
        ),
        Check("--max-length", minimum=2),
    ] = None
    log_samples: Annotated[bool, typer.Option(help="Keep lm-eval's per-sample records beside its results.")] = False
    metadata: Annotated[
        Optional[str],
        typer.Option(
            help='lm-eval task metadata as JSON, e.g. \'{"max_seq_lengths": '
            "[4096, 8192]}' for its RULER port (the model's tokenizer is "
            'added as "tokenizer").'
        ),
    ] = None
    out: OutOpt = None
    overwrite: OverwriteOpt = False
    load: Annotated[Load, Omit("attn", "device_map", "max_memory")] = Load()  # lm-eval's HFLM wraps it as it is
    engine: Engine = Engine()


class LmEval(Measurement):
    task = "lm-eval"
    notes_noops = False

    def __init__(self, opt: LmEvalOptions) -> None:
        super().__init__(opt.out, opt.overwrite, opt.load, opt.engine)
        self.opt = opt

    def settle(self) -> None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise CtxevalError(
                "ctxeval lm-eval runs in one process (lm-eval shards a loaded model itself only through "
                "its own launcher); run it without torchrun"
            )
        self.names = tuple(t.strip() for t in self.opt.tasks.split(",") if t.strip())
        self.model = self.opt.model or DEFAULT_MODEL

    def method_specs(self) -> list[MethodSpec]:
        return method_specs(self.opt.method, self.opt.factor)

    def check(self) -> None:
        from ..evals.lm_eval_bridge import LmEvalConfig, parse_metadata, require_lm_eval, task_manager

        self.lm_eval = require_lm_eval()  # lm-eval's import takes seconds: after the run directory's check
        opt = self.opt
        self.cfg = LmEvalConfig(
            self.names,
            opt.max_length or 2,
            opt.include_path,
            opt.limit,
            opt.num_fewshot,
            opt.batch_size,
            opt.log_samples,
            parse_metadata(opt.metadata, None),
        )
        task_manager(self.cfg)  # unknown tasks and bad metadata fail before the model loads

    def default_lengths(self) -> list[int]:
        """One length: --max-length, or the trained length times the largest factor (--max-length sets the factor)."""
        return [self.opt.max_length or extended_length(self.specs, self.lm.trained_length or 2048)]

    def prepare(self) -> None:
        from ..evals.lm_eval_bridge import TESTED_VERSION, parse_metadata

        trained = self.lm.trained_length or 2048
        self.cfg = replace(
            self.cfg,
            max_length=self.opt.max_length or extended_length(self.specs, trained),
            metadata=parse_metadata(self.opt.metadata, getattr(self.lm.tokenizer, "name_or_path", None)),
        )
        self.lengths = [self.cfg.max_length]
        version = self.lm_eval.__version__
        if version != TESTED_VERSION:
            err.print(f"note: lm-eval {version} is installed; ctxeval is tested with {TESTED_VERSION}")
        err.print(
            f"note: lm-eval keeps the last {self.cfg.max_length:,} tokens of each input (trained length {trained:,})"
        )

    def records(self, backend_spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        from ..evals.lm_eval_bridge import parse_metadata

        opt, cfg = self.opt, self.cfg
        self.backend_spec = backend_spec
        spec_record = {
            "task": "lm-eval",
            "model": self.model,
            "tasks": list(self.names),
            "methods": [s.label for s in self.specs],
            "max_length": cfg.max_length,
            "limit": opt.limit,
            "num_fewshot": opt.num_fewshot,
            "include_path": opt.include_path,
            "metadata": parse_metadata(opt.metadata, None),
            "dtype": self.lm.dtype,
            **backend_spec,
        }
        provenance = {
            "model": self.lm.record(),
            "lm_eval": {
                "version": self.lm_eval.__version__,
                "batch_size": opt.batch_size,
                "metadata": cfg.metadata,
                "log_samples": opt.log_samples,
                "evaluator": "lm_eval.simple_evaluate on "
                + (
                    "lm_eval.models.vllm_causallms.VLLM (one engine per method)"
                    if backend_spec
                    else "lm_eval.models.huggingface.HFLM(pretrained=<loaded model>)"
                ),
            },
        }
        return spec_record, provenance

    def work(self, store: RunStore, progress: Progress) -> None:
        from ..evals.lm_eval_bridge import evaluate

        evaluate(self.lm, self.specs, self.cfg, store, progress)

    def render(self, store: RunStore) -> None:
        from ..report.kinds.lm_eval import render_lm_eval

        title = f"{self.model}: lm-eval {', '.join(self.names)}" + (" on vLLM" if self.backend_spec else "")
        print_outputs(render_lm_eval(store, title))


@user_errors
@with_blocks
def lm_eval_cmd(opt: LmEvalOptions) -> None:
    """Run lm-evaluation-harness tasks under each method (loaded once, applied in place, verified): rows, table,
    lm-eval's own JSON."""
    LmEval(opt).run()
