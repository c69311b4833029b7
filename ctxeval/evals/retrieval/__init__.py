"""Key-value and needle retrieval benchmarks reproduced from their originals, generator and scorer each: LITM's
key-value retrieval (litm_kv), HELMET's json_kv (helmet_json_kv), InfiniteBench's passkey, number_string,
kv_retrieval and math_find (infinitebench) and their scorers (infinitebench_scoring). Pure Python: no model, no
tokenizer."""
