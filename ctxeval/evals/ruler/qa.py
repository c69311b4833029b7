"""RULER's scripts/data/synthetic/qa.py (qa_1: SQuAD, qa_2: HotpotQA): a question with its gold paragraph(s)
among distractor documents, and the dataset files RULER downloads for it."""

from __future__ import annotations

import random
from pathlib import Path

from ...errors import CtxevalError
from ...util.hub import download
from ...util.textfiles import read_json
from .sources import Sources, Stream
from .tasks import TASKS, RulerTask, task_template

# scripts/data/synthetic/json/download_qa_dataset.sh: the files and the URLs RULER fetches them from, in its order
QA_URLS: dict[str, list[str]] = {
    "squad.json": ["https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"],
    "hotpotqa.json": [
        "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
        "https://huggingface.co/datasets/namlh2004/hotpotqa/resolve/"
        "7e54db4656209750ff487f6fdf8e39a66dba136b/hotpot_dev_distractor_v1.json",
    ],
}


def qa_folder(tasks: list[str], given: Path | None, cache: Path) -> Path:
    """The folder with the QA files the qa tasks among `tasks` read: `given` (--qa-data) as it is, else `cache`,
    where missing files are downloaded from RULER's URLs (one line naming --qa-data when that fails)."""
    if given is not None:
        return Path(given)
    for name in dict.fromkeys(QA.FILES[TASKS[t].args["dataset"]] for t in tasks if TASKS[t].family == "qa"):
        if not (cache / name).is_file():
            download(
                QA_URLS[name],
                cache / name,
                f"{name} ({'qa_1' if name == 'squad.json' else 'qa_2'})",
                "download it as RULER's download_qa_dataset.sh does and pass its folder with --qa-data DIR, "
                "or leave qa_1/qa_2 out of --tasks",
            )
    return cache


class QA:
    """scripts/data/synthetic/qa.py: a question with its gold paragraph(s) among distractor documents."""

    DOCUMENT = "Document {i}:\n{document}"
    FILES = {"squad": "squad.json", "hotpotqa": "hotpotqa.json"}

    def __init__(self, task: RulerTask, sources: Sources, stream: Stream, model_template: str = "base") -> None:
        dataset = task.args["dataset"]
        if sources.qa_dir is None or not (Path(sources.qa_dir) / self.FILES[dataset]).is_file():
            raise CtxevalError(
                f"{task.name} reads {self.FILES[dataset]} (RULER's download_qa_dataset.sh: SQuAD 2.0 dev "
                "as squad.json, HotpotQA dev distractor as hotpotqa.json); pass --qa-data DIR"
            )
        path = Path(sources.qa_dir) / self.FILES[dataset]
        data = read_json(path, f"{task.name}'s", max_bytes=1 << 30, finite=False)
        try:
            self.qas, self.docs = self._squad(data) if dataset == "squad" else self._hotpotqa(data)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise CtxevalError(
                f"{path} is not the {dataset} file RULER reads ({type(exc).__name__}: {str(exc)[:100]})"
            ) from None
        if not self.qas or not self.docs:
            raise CtxevalError(f"{path} holds no answerable questions; give the {dataset} file RULER reads")
        self.stream, self.template, self.index = stream, task_template(task, model_template), 0

    @staticmethod
    def _squad(data: dict) -> tuple[list[dict], list[str]]:
        docs = sorted(set(p["context"] for d in data["data"] for p in d["paragraphs"]))
        index = {c: i for i, c in enumerate(docs)}
        qas = []
        for d in data["data"]:
            more = [index[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                for qa in p["qas"]:
                    if not qa["is_impossible"]:
                        qas.append(
                            {
                                "query": qa["question"],
                                "outputs": [a["text"] for a in qa["answers"]],
                                "context": [index[p["context"]]],
                                "more_context": [i for i in more if i != index[p["context"]]],
                            }
                        )
        return qas, docs

    @staticmethod
    def _hotpotqa(data: list) -> tuple[list[dict], list[str]]:
        docs = sorted(set(f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]))
        index = {c: i for i, c in enumerate(docs)}
        qas = [
            {
                "query": d["question"],
                "outputs": [d["answer"]],
                "context": [index[f"{t}\n{''.join(p)}"] for t, p in d["context"]],
            }
            for d in data
        ]
        return qas, docs

    def __call__(self, num_docs: int) -> tuple[str, list[str]]:
        r = self.stream.random
        qa = self.qas[self.index]
        gold, more = qa["context"], qa.get("more_context", [])
        if num_docs < len(self.docs):
            if num_docs - len(gold) > len(more):
                other = [i for i in range(len(self.docs)) if i not in gold + more]
                chosen = gold + more + r.sample(other, max(0, num_docs - len(gold) - len(more)))
            else:
                chosen = gold + r.sample(more, num_docs - len(gold))
            documents = [self.docs[i] for i in chosen]
        else:
            repeats = (num_docs + len(self.docs) - 1) // len(self.docs)
            documents = (self.docs * repeats)[:num_docs]
        random.Random(self.stream.seed).shuffle(documents)
        context = "\n\n".join(self.DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(documents))
        return self.template.format(context=context, query=qa["query"]), qa["outputs"]

    def increment(self, length: int) -> int:
        return 10
