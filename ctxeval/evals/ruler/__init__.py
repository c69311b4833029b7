"""RULER, file for file as its scripts: task definitions and templates (tasks), essays, word lists and the random
stream (sources), one generator per script family (niah, vt, words, qa), sizing and scoring (generate), and the
measuring loop with its rows (run)."""
