"""How close a free-text answer is to a reference answer: content-word F1, for 'similar' checks.

:func:`similarity` compares the two texts' sets of content words (:func:`content_words`: casefolded,
function words dropped, word endings stripped, numbers and negations kept) as the harmonic mean of
precision and recall. :func:`answer_opening` picks the part of an answer that is judged: as many
paragraphs as the reference has, after a lead-in line ending in ":".
"""

from __future__ import annotations

import re

# Function words carry no content: "the library will close" and "a library is to close" say the same.
# fmt: off
_STOP_WORDS = frozenset(
    {
        "a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any", "are", "as", "at",
        "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did",
        "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have",
        "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is",
        "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off",
        "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should",
        "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these",
        "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what",
        "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours",
        "yourself", "yourselves", "s", "t"
    }
)
# fmt: on
_KEEP_NEGATION = frozenset({"no", "not", "nor"})  # dropped above, but "not guilty" ≠ "guilty"
_WORD = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+")


def _stem(word: str) -> str:
    """A crude suffix strip so that close/closes/closed/closing and library/libraries meet; a real
    stemmer would be a dependency, and this one only has to make word forms of one text agree."""
    if word[0].isdigit():
        return word.replace(",", "")  # 20,000 and 20000
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith("ed"):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def content_words(text: str) -> frozenset[str]:
    """The set of stemmed content words of ``text``: casefolded, without function words, numbers
    kept (20,000 as 20000), negations kept."""
    words = (w for w in _WORD.findall(text.casefold()))
    return frozenset(_stem(w) for w in words if w in _KEEP_NEGATION or w not in _STOP_WORDS)


def similarity(answer: str, reference: str) -> float:
    """Content-word F1 of ``answer`` against ``reference``, 0..1: with A and R the two texts'
    content-word sets, precision |A∩R|/|A|, recall |A∩R|/|R|, and their harmonic mean.

    Chosen over ROUGE-L (the longest common subsequence) because a paraphrase often reorders a
    sentence ("the council will close the library" / "the library is to be closed by the
    council") and an order-blind measure does not punish that; sets rather than counts, so a model
    that repeats itself gains nothing. No synonyms: a summary must use the article's words, which
    summaries mostly do. 0.0 when either text has no content words."""
    a, r = content_words(answer), content_words(reference)
    common = len(a & r)
    if not common:
        return 0.0
    precision, recall = common / len(a), common / len(r)
    return 2 * precision * recall / (precision + recall)


_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def paragraphs(text: str) -> list[str]:
    """The non-empty paragraphs of ``text`` (separated by blank lines), stripped."""
    return [part.strip() for part in _PARAGRAPH_BREAK.split(text) if part.strip()]


def answer_opening(answer: str, count: int) -> str:
    """The answer's first ``count`` paragraphs, after a lead-in such as "Here is a summary:".
    A base model writes its answer and then goes on with the next item ("\n\nArticle: ..."),
    often restating the text it was given: only the opening is the answer."""
    parts = paragraphs(answer)
    if len(parts) > 1 and parts[0].endswith(":"):
        parts = parts[1:]
    return "\n\n".join(parts[:count])
