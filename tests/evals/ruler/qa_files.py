"""SQuAD- and HotpotQA-shaped files for RULER's qa tasks, written offline."""


def write_qa_files(folder):
    """Small files in SQuAD 2.0 / HotpotQA dev formats, from sentences made here (not from CPython's docs, which
    change between Python releases); benchmarks/ruler_parity.py --qa-data checked that RULER's qa.py writes the
    prompts below from exactly these files."""
    import json

    things = [
        "river",
        "lamp",
        "garden",
        "engine",
        "letter",
        "window",
        "violin",
        "harbor",
        "ladder",
        "orchard",
        "kettle",
    ]
    colors = ["red", "amber", "green", "silver", "violet", "grey", "golden"]
    verbs = ["waits near", "points at", "rolls past", "hides behind", "leans on"]
    sents = [
        f"Note {n} says that the {colors[n % 7]} {things[n % 11]} {verbs[n % 5]} the {things[(n * 3 + 1) % 11]} "
        f"every {n % 9 + 2} days."
        for n in range(400)
    ]
    data = []
    for a in range(10):
        paragraphs = []
        for p in range(4):
            ctx = " ".join(sents[(a * 4 + p) * 3 : (a * 4 + p) * 3 + 3])
            paragraphs.append(
                {
                    "context": ctx,
                    "qas": [
                        {
                            "question": f"Which word comes fourth in paragraph {a}-{p}?",
                            "is_impossible": False,
                            "answers": [{"text": ctx.split()[3], "answer_start": 0}],
                            "id": f"{a}-{p}",
                        },
                        {"question": "Unanswerable?", "answers": [], "is_impossible": True, "id": f"{a}-{p}-x"},
                    ],
                }
            )
        data.append({"title": f"t{a}", "paragraphs": paragraphs})
    (folder / "squad.json").write_text(json.dumps({"version": "v2.0", "data": data}))
    hot = []
    for q in range(30):
        ctx = [[f"Title {q}-{k}", sents[(q * 5 + k) * 2 : (q * 5 + k) * 2 + 2]] for k in range(5)]
        hot.append(
            {"question": f"What is the first word of Title {q}-0?", "answer": ctx[0][1][0].split()[0], "context": ctx}
        )
    (folder / "hotpotqa.json").write_text(json.dumps(hot))
    return folder
