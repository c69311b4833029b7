"""RULER's scripts/data/synthetic/variable_tracking.py: chains of variable assignments hidden in the noise
haystack, behind the few-shot example the script prepends."""

from __future__ import annotations

import string

from .sources import Sources, Stream
from .tasks import FAMILIES, NOISE, RulerTask, task_template


class VariableTracking:
    """scripts/data/synthetic/variable_tracking.py (noise haystack; the few-shot example it prepends)."""

    def __init__(self, task: RulerTask, sources: Sources, stream: Stream, model_template: str = "base") -> None:
        self.chains, self.hops = task.args["num_chains"], task.args["num_hops"]
        self.stream = stream
        self.template = task_template(task, model_template)
        self.icl_template = task_template(task)  # the few-shot example is built without the model template
        self.family = FAMILIES[task.family]
        self.example: str | None = None  # the few-shot example, built by `prepare`

    def _chains(self, is_icl: bool) -> tuple[list[list[str]], list[list[str]]]:
        r, rn = self.stream.random, self.stream.numpy
        k = 3 if is_icl else 5
        hops = min(10, self.hops) if is_icl else self.hops
        names = ["".join(r.choices(string.ascii_uppercase, k=k)).upper() for _ in range((hops + 1) * self.chains)]
        while len(set(names)) < self.chains * (hops + 1):
            if len(names) > 100 * self.chains * (hops + 1) + 1000:  # a bound for a broken draw: never reached
                raise RuntimeError(f"vt: {len(names)} draws gave fewer than {self.chains * (hops + 1)} distinct names")
            names.append("".join(r.choices(string.ascii_uppercase, k=k)).upper())
        variables, chains = [], []
        for i in range(0, len(names), hops + 1):
            these = names[i : i + hops + 1]
            variables.append(these)
            chain = [f"VAR {these[0]} = 12345" if is_icl else f"VAR {these[0]} = {rn.randint(10000, 99999)}"]
            chain += [f"VAR {these[j + 1]} = VAR {these[j]} " for j in range(hops)]
            chains.append(chain)
        return variables, chains

    def generate(self, num_noises: int, is_icl: bool = False) -> tuple[str, list[str]]:
        r = self.stream.random
        variables, chains = self._chains(is_icl)
        value = chains[0][0].split("=")[-1].strip()
        lines = [NOISE] * num_noises
        for chain in chains:
            positions = sorted(r.sample(range(len(lines)), len(chain)))
            for j, position in enumerate(positions):
                lines.insert(position + j, chain[j])
        context = "\n".join(lines).replace(". \n", ".\n")
        template = self.icl_template if is_icl else self.template
        return template.format(context=context, query=value, num_v=self.hops + 1), variables[0]

    def _randomize_example(self) -> str:
        r, rn = self.stream.random, self.stream.numpy
        example = self.example or ""
        for item in example.strip().split()[-self.hops - 1 :]:
            example = example.replace(item, "".join(r.choices(string.ascii_uppercase, k=len(item))).upper())
        return example.replace("12345", str(rn.randint(10000, 99999)))

    def __call__(self, num_noises: int) -> tuple[str, list[str]]:
        text, answer = self.generate(num_noises)
        if self.example is not None:
            cutoff = text.index(self.family.template[:20])
            text = text[:cutoff] + self._randomize_example() + "\n" + text[cutoff:]
        return text, answer

    def increment(self, length: int) -> int:
        return 5 if length < 4096 else 10
