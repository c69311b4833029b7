"""python -m ctxeval.tiny train [--member NAME] [--out DIR] [--minutes N | --steps N] [--seed S]
python -m ctxeval.tiny reproduce NAME [--steps N]   (retrain the first N steps; compare with the shipped log)
python -m ctxeval.tiny heldout DIR   (write the held-out pydoc documents as DIR/NN-title.txt)

Members (ctxeval/tiny/family.py): tiny (RoPE), tiny-nope, tiny-rope-gpt, tiny-alibi, tiny-learned, tiny-sinusoidal."""

from __future__ import annotations

import argparse
import sys

from .family import MEMBERS, member_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ctxeval.tiny", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train tokenizer + model from scratch on the CPU")
    tr.add_argument(
        "--member",
        default="tiny",
        choices=list(MEMBERS),
        help="which position encoding (default tiny: RoPE); see ctxeval/tiny/family.py",
    )
    tr.add_argument("--out", default=None, help="output directory (default: where the member ships in the package)")
    tr.add_argument(
        "--minutes", type=float, default=None, help="train for about N minutes (step count from measured speed)"
    )
    tr.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: the bundled weights were trained with 1; other counts sum floats "
        "in another order and give a slightly different model)",
    )
    tr.add_argument("--rope-theta", type=float, default=None, help="RoPE base (default: the recipe's)")
    tr.add_argument("--head-dim", type=int, default=None, help="attention head dim (default: the recipe's)")
    tr.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override any TinyConfig field (JSON value), e.g. --set weight_decay=0 --set lr=1e-3",
    )
    rp = sub.add_parser(
        "reproduce", help="retrain a shipped member's first steps (1 thread) and compare its losses with its log"
    )
    rp.add_argument("member", choices=list(MEMBERS))
    rp.add_argument("--steps", type=int, default=100, help="steps to retrain (a multiple of 50; default 100)")
    ho = sub.add_parser("heldout", help="write the held-out documents (the `pydoc` evaluation corpus) as .txt files")
    ho.add_argument("dir")
    args = parser.parse_args(argv)

    if args.command == "heldout":
        from .corpus import write_held_out

        for path in write_held_out(args.dir):
            print(path)
        return 0
    if args.command == "reproduce":
        if args.steps < 50 or args.steps % 50:
            parser.error(f"--steps {args.steps}: the log holds every 50th step; give a multiple of 50, e.g. 100")
        from .reproduce import reproduce

        return reproduce(args.member, args.steps, log=lambda m: print(m, flush=True))

    import torch

    from .train import TinyConfig, train

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TinyConfig(seed=args.seed, member=args.member)
    if args.steps:
        cfg.steps = args.steps
    if args.rope_theta:
        cfg.rope_theta = args.rope_theta
    if args.head_dim:
        cfg.head_dim = args.head_dim
    for item in args.set:
        from ..errors import CtxevalError
        from ..util.textfiles import parse_json

        name, _, value = item.partition("=")
        if not hasattr(cfg, name):
            parser.error(f"--set: TinyConfig has no field '{name}'")
        try:
            setattr(cfg, name, parse_json(value, f"--set {name}: '{value}'"))
        except CtxevalError as exc:
            parser.error(f"{exc}; write a JSON value, e.g. --set lr=0.003")
    out = args.out or str(member_dir(args.member))
    train(out, cfg, minutes=args.minutes, log=lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
