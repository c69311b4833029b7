"""RULER, file for file as its scripts: task definitions (tasks), essays, word lists and the random stream (sources),
one generator per script family (niah, vt, words, qa), sizing and scoring (generate), and the measuring loop with its
rows (run), which runs the retrieval suites' tasks too. Imports retrieval/ (its tasks, sizing and released files) and
prompts/ (the sample record, the templates); neither imports this package."""
