"""RoPE methods: the pure math of every frequency method (methods), a method parameter declared and a user's value
coerced to it (params, shared with the attention methods), a config's rotary geometry and trained length
(geometry), applying a method to a loaded model in place with its read-back and restore (patching), and the lower
bound on the base a length needs (bound)."""
