"""The bottom layer: numbers as users write them (numbers), safe reading and writing of outside files (textfiles),
the cache and bundled-model paths (paths), and the hub's offline switch (hub). Imports nothing of ctxeval but errors."""
