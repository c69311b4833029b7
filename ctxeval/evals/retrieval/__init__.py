"""Key-value and needle retrieval benchmarks reproduced from their originals, generator and scorer each: LITM's
key-value retrieval (litm_kv), HELMET's json_kv (helmet_json_kv), InfiniteBench's passkey, number_string,
kv_retrieval and math_find (infinitebench) and their scorers (infinitebench_scoring), BABILong's prompts, scorer and
fact interleaving with generated bAbI-format stories (babilong: facts:qa1, facts:qa2). Pure Python: no model, no
tokenizer (babilong counts tokens with a function passed in). The suite as `ctxeval ruler` runs it (suite) and the
originals' released files (originals) yield evals.prompts' sample record; nothing here imports ruler/."""
