"""data/presets.py: the bundled presets."""

from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.data.presets import preset_names

runner = CliRunner()


PRESETS = [n.removeprefix("needle-") for n in preset_names("needle")]


def test_all_presets_listed():
    assert set(PRESETS) == {
        "magic-number",
        "magic-number-multikey",
        "magic-number-multivalue",
        "magic-number-multiquery",
        "passkey",
        "gkamradt",
    }


def needle(*args):
    return runner.invoke(app, ["needle", *args])
