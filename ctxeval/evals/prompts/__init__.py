"""What RULER's tasks (ruler/) and the retrieval suites (retrieval/) share, below both: the sample record RULER's
JSONL holds, which every task of `ctxeval ruler` yields (sample), RULER's model templates and ctxeval's `auto` and
`chat` (templates), and how a prompt is wrapped in one of them for the model (wrapping). Neither package is imported
here; ruler/ imports retrieval/, never the other way."""
