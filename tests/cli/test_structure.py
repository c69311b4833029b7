"""The shape of ctxeval/cli (issue 38): short functions, every option declared once, one measuring recipe whose order
refuses bad input before any model loads."""

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer
import typer.main
from typer.testing import CliRunner

import ctxeval.cli
from ctxeval.cli import app, run
from ctxeval.cli.options import Load, Omit, with_blocks

CLI = Path(ctxeval.cli.__file__).parent
MAX_FUNCTION_LINES = 60
runner = CliRunner()


def cli_sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(CLI.glob("*.py"))}


def long_functions(sources: dict[str, str], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'file:name (n lines)' for every function (methods and nested ones too) longer than `limit` lines, counted from
    `def` to its last line: signature and docstring included, decorators not."""
    found = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{name}:{node.name} ({lines} lines)")
    return found


def test_no_function_in_the_cli_is_over_60_lines():
    assert long_functions(cli_sources()) == []


def test_the_length_check_sees_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions({"m.py": f"@decorated\ndef f():\n{body}\n"}) == ["m.py:f (61 lines)"]
    assert long_functions({"m.py": f"def f():\n{body[: body.rindex(chr(10))]}\n"}) == []


def test_the_cli_holds_at_most_12_modules():
    assert len(list(CLI.glob("*.py"))) <= 12


def option_declarations(sources: dict[str, str]) -> dict[str, list[str]]:
    """Option name -> where it is declared ('file:line'): every typer.Option/typer.Argument call, named by its
    '--name' strings, or (no names given) by the parameter or dataclass field it annotates. A module-level alias must
    name its option: its name cannot be known from where it is used. A flag's --no- form is not counted: it follows
    from the flag."""
    found: dict[str, list[str]] = {}

    def declared(call: ast.Call, where: str, owner: str | None) -> None:
        names = [
            part
            for arg in call.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-")
            for part in arg.value.split("/")
        ]
        if not names and call.func.attr == "Option":
            assert owner is not None, f"{where}: an option type outside a signature must name its option"
            names = ["--" + owner.replace("_", "-")]
        for name in names or [f"<argument {owner}>"]:
            found.setdefault(name.strip(), []).append(where)

    def calls(node: ast.AST) -> list[ast.Call]:
        return [
            n
            for n in ast.walk(node)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("Option", "Argument")
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id == "typer"
        ]

    for file, text in sources.items():
        tree = ast.parse(text)
        owned: set[int] = set()
        for node in ast.walk(tree):
            annotated = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                annotated = [(a.arg, a.annotation) for a in node.args.args + node.args.kwonlyargs if a.annotation]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                annotated = [(node.target.id, node.annotation)]
            for owner, annotation in annotated:
                for call in calls(annotation):
                    owned.add(id(call))
                    declared(call, f"{file}:{call.lineno}", owner)
        for call in calls(tree):
            if id(call) not in owned:
                declared(call, f"{file}:{call.lineno}", None)
        for node in ast.walk(tree):  # reworded(..., short="-f"): a one-letter name added where the option is reworded
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "reworded":
                for keyword in node.keywords:
                    if keyword.arg == "short" and isinstance(keyword.value, ast.Constant):
                        found.setdefault(keyword.value.value, []).append(f"{file}:{node.lineno}")
    return found


def test_every_option_is_declared_in_one_place():
    twice = {name: where for name, where in option_declarations(cli_sources()).items() if len(where) > 1}
    assert twice == {}


def test_the_declaration_scan_sees_every_option_of_every_command():
    declared = set(option_declarations(cli_sources()))
    root = typer.main.get_command(app)
    used = {
        name
        for command in root.commands.values()
        for param in command.params
        if param.param_type_name == "option"
        for name in param.opts  # not the --no- forms: they follow from their flag
    }
    assert used - declared == set()
    assert "--method" in declared and "-m" in declared and "--vllm-arg" in declared


def test_the_declaration_scan_finds_an_option_declared_twice():
    one = 'import typer\nA = Annotated[str, typer.Option("--method", "-m", help="x")]\n'
    two = "import typer\ndef cmd(method: Annotated[str, typer.Option(help='y')] = ''): ...\n"
    found = option_declarations({"a.py": one, "b.py": two})
    assert found["--method"] == ["a.py:2", "b.py:2"] and found["-m"] == ["a.py:2"]
    with pytest.raises(AssertionError, match="must name its option"):
        option_declarations({"c.py": "import typer\nB = Annotated[str, typer.Option(help='z')]\n"})


@dataclass(frozen=True)
class Toy:
    name: Annotated[str, typer.Option("--name", help="A name.")] = "x"
    load: Annotated[Load, Omit("attn", "max_memory")] = Load()
    count: Annotated[Optional[int], typer.Option("--count", help="A count.")] = None


def test_with_blocks_spreads_a_block_into_the_signature_and_hands_back_one_object():
    seen = []

    @with_blocks
    def command(opt: Toy, flag: bool = False) -> None:
        seen.append((opt, flag))

    names = list(inspect.signature(command).parameters)
    assert names == ["name", "dtype", "device", "trust_remote_code", "device_map", "count", "flag"]
    toy_app = typer.Typer()
    toy_app.command()(command)
    result = runner.invoke(toy_app, ["--name", "y", "--dtype", "float32", "--count", "3", "--flag"])
    assert result.exit_code == 0, result.output
    assert seen == [(Toy(name="y", load=Load(dtype="float32"), count=3), True)]
    assert seen[0][0].load.attn == "sdpa" and seen[0][0].load.max_memory is None  # omitted: the block's defaults


@pytest.fixture
def loader_fails(monkeypatch, tmp_path):
    """Every way to a model raises: a command that reaches the loader fails the test loudly."""

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(run, "load_for", load)
    monkeypatch.setattr(run, "load_model", load)
    monkeypatch.chdir(tmp_path)
    return tmp_path


BAD_INPUT = {
    "ppl": (["ppl", "--lengths", "abc"], "bad length 'abc' in --lengths 'abc'"),
    "needle": (["needle", "--lengths", "abc"], "bad length 'abc' in --lengths 'abc'"),
    "passkey": (["passkey", "--lengths", "abc"], "bad length 'abc' in --lengths 'abc'"),
    "ruler": (["ruler", "--lengths", "abc"], "bad length 'abc' in --lengths 'abc'"),
    "entropy": (["entropy", "--lengths", "abc"], "bad length 'abc' in --lengths 'abc'"),
    "lm-eval": (["lm-eval", "--tasks", "x", "-m", "bogus"], "unknown method 'bogus'"),
    "tune": (["tune", "--target-length", "abc"], "bad length 'abc' in --lengths 'abc'"),
}


@pytest.mark.parametrize("command", list(BAD_INPUT))
def test_every_measuring_command_refuses_bad_input_before_the_model_loads(loader_fails, command):
    if command == "lm-eval":
        pytest.importorskip("lm_eval")
    args, fragment = BAD_INPUT[command]
    result = runner.invoke(app, args)
    assert not isinstance(result.exception, AssertionError), "the model was loaded first"
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error:") and fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (loader_fails / "runs").exists()


@pytest.mark.parametrize(
    "args",
    [["ppl"], ["needle"], ["passkey"], ["ruler", "--tasks", "vt"], ["entropy"], ["tune", "--target-length", "1k"]],
)
def test_good_input_reaches_the_patched_loader(loader_fails, args):
    """The patch point of the test above is the one the recipe loads through."""
    if args[0] == "tune":
        pytest.importorskip("optuna")
    result = runner.invoke(app, [*args, "--model", "tiny"] + (["--lengths", "4k"] if args[0] != "tune" else []))
    assert isinstance(result.exception, AssertionError) and "loaded before" in str(result.exception)


def test_the_recipe_takes_its_steps_in_one_order(monkeypatch):
    steps = []

    class Model:
        trained_length = 8

    def step(name, value=None):
        def record(*args, **kwargs):
            steps.append(name)
            return value

        return record

    monkeypatch.setattr(run, "load_for", step("load", Model()))
    monkeypatch.setattr(run, "settle_factors", step("factors", []))
    monkeypatch.setattr(run, "note_attention_noops", step("no-op notes"))
    monkeypatch.setattr(run, "prepare_backend", step("backend", {}))
    monkeypatch.setattr(run, "measure", step("measure"))
    monkeypatch.setattr(run, "check_run_dir", step("run directory"))
    monkeypatch.setattr(run, "check_attention_sizes", step("attention sizes"))
    monkeypatch.setattr(run, "readable_config", step("config"))
    monkeypatch.setattr(run, "shipped_attention", step("shipped attention", []))

    class Recorded(run.Measurement):
        task = "toy"
        method_specs = step("method_specs", [])
        records = step("records", ({}, {}))
        work = render = step("never: measure is patched")

    for hook in (
        "settle",
        "check",
        "check_data",
        "check_engine",
        "loaded",
        "configure",
        "prepare",
        "before_measure",
    ):
        setattr(Recorded, hook, step(hook))
    Recorded.identical_methods = step("identical methods", {})
    Recorded.dry_run = step("dry_run", False)
    Recorded.default_lengths = step("default_lengths", [8])
    Recorded.longest = step("longest", 8)
    Recorded.message = step("message", "")
    Recorded(None, False, Load()).run()
    assert steps == [
        "settle",
        "method_specs",
        "run directory",
        "check",
        "dry_run",
        "config",
        "check_data",
        "check_engine",
        "attention sizes",
        "load",
        "loaded",
        "shipped attention",
        "default_lengths",
        "configure",
        "factors",
        "identical methods",
        "no-op notes",
        "prepare",
        "longest",
        "backend",
        "records",
        "before_measure",
        "message",
        "measure",
    ]


def test_a_dry_run_stops_the_recipe_before_the_data_and_the_load(monkeypatch):
    steps = []
    monkeypatch.setattr(run, "load_for", lambda *a, **k: steps.append("load"))

    class DryRun(run.Measurement):
        task = "toy"

        def method_specs(self):
            return []

        records = work = render = method_specs

        def dry_run(self):
            return True

        def check_data(self):
            steps.append("check_data")

    DryRun(None, False, Load()).run()
    assert steps == []
