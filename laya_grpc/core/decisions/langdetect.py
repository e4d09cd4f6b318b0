"""Script and language detection that picks the checkpoint for an auto-routed request.

Upstream `laya serve` reports this detection verbatim in every auto-routed response
(`routing.detection`) and routes on it, so this module must return, for every state, the dict
`laya.lang.analyse(state)` returns in laya 0.4.15: same keys, same key order, same floats. It is
our own implementation of those rules, kept dependency-free (no torch, no laya) because the
gateway calls it on every request; tests/test_routing_parity.py holds it to upstream.

The rules, in short: flatten the state's string values (keys are field names, not content);
count letters per Unicode script; non-Latin text is not for the English checkpoint. Latin text
is scored against per-language function-word lists and a rate of letters English does not use;
"undecided" is kept apart from "English". A state that reads English overall is then checked
line by line and value by value, so a short foreign message is not outvoted by a long English
payload around it.
"""
from __future__ import annotations

import bisect
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping
from typing import Any, NamedTuple, Optional

# --------------------------------------------------------------------------------------- scripts

# Unicode blocks of the scripts the detection names. A letter in none of them (and not Latin)
# counts as "other", which is still non-Latin: an unreadable script must never look like English.
_SCRIPT_RANGES = (
    ("greek", ((0x0370, 0x03FF), (0x1F00, 0x1FFF))),
    ("cyrillic", ((0x0400, 0x052F), (0x2DE0, 0x2DFF), (0xA640, 0xA69F))),
    ("armenian", ((0x0530, 0x058F),)),
    ("hebrew", ((0x0590, 0x05FF),)),
    ("arabic", ((0x0600, 0x06FF), (0x0750, 0x077F), (0x08A0, 0x08FF), (0xFB50, 0xFDFF),
                (0xFE70, 0xFEFF))),
    ("devanagari", ((0x0900, 0x097F), (0xA8E0, 0xA8FF))),
    ("bengali", ((0x0980, 0x09FF),)),
    ("gurmukhi", ((0x0A00, 0x0A7F),)),
    ("gujarati", ((0x0A80, 0x0AFF),)),
    ("oriya", ((0x0B00, 0x0B7F),)),
    ("tamil", ((0x0B80, 0x0BFF),)),
    ("telugu", ((0x0C00, 0x0C7F),)),
    ("kannada", ((0x0C80, 0x0CFF),)),
    ("malayalam", ((0x0D00, 0x0D7F),)),
    ("sinhala", ((0x0D80, 0x0DFF),)),
    ("thai", ((0x0E00, 0x0E7F),)),
    ("lao", ((0x0E80, 0x0EFF),)),
    ("tibetan", ((0x0F00, 0x0FFF),)),
    ("myanmar", ((0x1000, 0x109F),)),
    ("georgian", ((0x10A0, 0x10FF),)),
    ("ethiopic", ((0x1200, 0x137F),)),
    ("khmer", ((0x1780, 0x17FF),)),
    ("hangul", ((0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7AF))),
    ("kana", ((0x3040, 0x309F), (0x30A0, 0x30FF), (0x31F0, 0x31FF))),
    ("han", ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF))),
)
_BLOCKS = sorted((lo, hi, name) for name, ranges in _SCRIPT_RANGES for lo, hi in ranges)
_BLOCK_STARTS = [lo for lo, _, _ in _BLOCKS]

# Letters that an older interpreter's Unicode database leaves unassigned (Python 3.10 ships
# Unicode 13, 3.11 14, 3.12 15) but Unicode 16 calls letters. Upstream adds them so that what is a
# letter does not depend on the host; generated from the two databases upstream.
_LATE_LETTER_RANGES = (
    (0x01C89, 0x01C8A), (0x0A7CB, 0x0A7CD), (0x0A7DA, 0x0A7DC), (0x10570, 0x1057A),
    (0x1057C, 0x1058A), (0x1058C, 0x10592), (0x10594, 0x10595), (0x10597, 0x105A1),
    (0x105A3, 0x105B1), (0x105B3, 0x105B9), (0x105BB, 0x105BC), (0x105C0, 0x105F3),
    (0x10D4A, 0x10D65), (0x10D6F, 0x10D85), (0x10EC2, 0x10EC4), (0x10F70, 0x10F81),
    (0x1123F, 0x11240), (0x11380, 0x11389), (0x1138B, 0x1138B), (0x1138E, 0x1138E),
    (0x11390, 0x113B5), (0x113B7, 0x113B7), (0x113D1, 0x113D1), (0x113D3, 0x113D3),
    (0x11BC0, 0x11BE0), (0x11F02, 0x11F02), (0x11F04, 0x11F10), (0x11F12, 0x11F33),
    (0x12F90, 0x12FF0), (0x1342F, 0x1342F), (0x13441, 0x13446), (0x13460, 0x143FA),
    (0x16100, 0x1611D), (0x16A70, 0x16ABE), (0x16D40, 0x16D6C), (0x18CFF, 0x18CFF),
    (0x1B132, 0x1B132), (0x1B155, 0x1B155), (0x1DF25, 0x1DF2A), (0x1E030, 0x1E06D),
    (0x1E290, 0x1E2AD), (0x1E4D0, 0x1E4EB), (0x1E5D0, 0x1E5ED), (0x1E5F0, 0x1E5F0),
    (0x2B739, 0x2B739), (0x2EBF0, 0x2EE5D), (0x31350, 0x323AF),
)
_LATE_LETTER_FLOOR = _LATE_LETTER_RANGES[0][0]


def _is_letter(ch: str) -> bool:
    """`str.isalpha()`, plus the letters assigned after this interpreter's Unicode database."""
    if ch.isalpha():
        return True
    cp = ord(ch)
    if cp < _LATE_LETTER_FLOOR or unicodedata.category(ch) != "Cn":
        return False
    return any(lo <= cp <= hi for lo, hi in _LATE_LETTER_RANGES)


def _is_latin(cp: int, latin_block_end: int) -> bool:
    """Latin by codepoint: below `latin_block_end`, Latin Extended Additional, or fullwidth A-Z/a-z.

    Upstream draws the low boundary in two places: letter counting takes the IPA extensions
    (up to 0x02B0) as Latin, the non-Latin word scan stops at 0x0250. No named block lies in
    between, so both agree on what is *named*; the boundary is a parameter to keep both exact.
    """
    return (cp < latin_block_end or 0x1E00 <= cp <= 0x1EFF
            or 0xFF21 <= cp <= 0xFF3A or 0xFF41 <= cp <= 0xFF5A)


def _named_block(cp: int) -> Optional[str]:
    """Name of the `_SCRIPT_RANGES` block holding `cp`, or None."""
    i = bisect.bisect_right(_BLOCK_STARTS, cp) - 1
    if i >= 0 and cp <= _BLOCKS[i][1]:
        return _BLOCKS[i][2]
    return None


def _script_counts(text: str) -> dict[str, int]:
    """Letters of `text` per script: named scripts in order of first appearance, then `latin`.

    Latin goes last on purpose: `max` keeps the first of equal counts, so a named script wins a
    tie against Latin.
    """
    counts: dict[str, int] = {}
    latin = 0
    for ch in text:
        if not _is_letter(ch):
            continue
        cp = ord(ch)
        if _is_latin(cp, 0x02B0):
            latin += 1
            continue
        name = _named_block(cp) or "other"
        counts[name] = counts.get(name, 0) + 1
    counts["latin"] = latin
    return counts


def _dominant_script(counts: dict[str, int]) -> str:
    if not any(counts.values()):
        return "unknown"
    return max(counts.items(), key=lambda kv: kv[1])[0]


def _script_profile(counts: dict[str, int]) -> dict[str, float]:
    """Fraction of letters per script, Latin first (the order upstream reports)."""
    total = sum(counts.values())
    if not total:
        return {}
    ordered = {"latin": counts["latin"]} if counts.get("latin") else {}
    ordered.update((name, n) for name, n in counts.items() if name != "latin")
    return {name: n / total for name, n in ordered.items() if n}


# A Latin-plurality text is still carried by its non-Latin letters when they are a large share, or
# a smaller share that is at least a sentence's worth of letters.
NON_LATIN_FRACTION = 0.2
NON_LATIN_MIN_FRACTION = 0.1
NON_LATIN_MIN_LETTERS = 10


def _non_latin_carries(non_latin: float, n_non_latin: int) -> bool:
    return (non_latin >= NON_LATIN_FRACTION
            or (non_latin >= NON_LATIN_MIN_FRACTION and n_non_latin >= NON_LATIN_MIN_LETTERS))


def _non_latin_words(text: str) -> list[str]:
    """Runs of one named non-Latin script that read as words inside Latin prose.

    Single letters (a symbol such as `α`), capitalised runs (a proper name) and unnamed letters
    (IPA in a pronunciation) are not a request in another script. Combining marks are skipped so
    they never split a word.
    """
    runs: list[str] = []
    current, current_script = "", None
    for ch in text:
        if unicodedata.combining(ch):
            continue
        cp = ord(ch)
        script = None if _is_latin(cp, 0x0250) else _named_block(cp)
        if script is not None and script == current_script:
            current += ch
            continue
        if current:
            runs.append(current)
        current, current_script = (ch, script) if script is not None else ("", None)
    if current:
        runs.append(current)
    return [w for w in runs if len(w) >= 2 and not w[0].isupper()]


# ------------------------------------------------------------------------------- word evidence

# Function words per Latin-script language (data carried over from upstream laya 0.4.15).
# Dict order matters: ties between languages go to the earlier one.
STOPWORDS = {
    "en": frozenset({
        "after", "already", "always", "and", "any", "are", "aren", "as", "at", "be", "because",
        "been", "before", "being", "between", "both", "but", "can", "could", "couldn", "didn",
        "didnt", "does", "doesn", "doesnt", "doing", "done", "dont", "down", "during", "each",
        "ever", "every", "few", "for", "from", "has", "hasn", "have", "haven", "havent", "here",
        "him", "his", "how", "i", "if", "in", "into", "is", "isn", "isnt", "it", "ive", "many",
        "might", "much", "must", "never", "nor", "not", "of", "on", "only", "onto", "our", "please",
        "shall", "she", "should", "some", "than", "that", "thats", "the", "their", "them", "then",
        "there", "these", "they", "this", "those", "through", "to", "too", "until", "very", "was",
        "wasn", "wasnt", "we", "were", "weren", "what", "whats", "when", "where", "which", "while",
        "who", "whom", "why", "will", "with", "within", "without", "won", "wont", "would", "wouldn",
        "yet", "you", "your", "youre", "yours"
    }),
    "fr": frozenset({
        "alors", "au", "aux", "avec", "bien", "bonjour", "ce", "ces", "cette", "comment", "dans",
        "des", "deux", "dois", "doit", "donc", "du", "elle", "elles", "est", "et", "fait", "fois",
        "il", "ils", "je", "jour", "jours", "la", "le", "les", "ma", "mais", "merci", "mes", "mois",
        "mon", "nous", "ont", "ou", "pas", "peut", "peux", "plus", "pour", "pourquoi", "quand",
        "que", "qui", "sa", "ses", "sont", "sur", "ta", "tes", "ton", "tous", "tout", "toute",
        "trois", "très", "tu", "une", "veut", "veux", "vous", "être"
    }),
    "de": frozenset({
        "aber", "auch", "auf", "aus", "bei", "bitte", "das", "dem", "den", "der", "dich", "die",
        "diese", "diesen", "dieser", "dieses", "dir", "ein", "eine", "einem", "einen", "einer",
        "für", "gibt", "habe", "haben", "heute", "ich", "im", "in", "ist", "jetzt", "kann",
        "kannst", "mein", "meine", "meinem", "meinen", "meiner", "mich", "mir", "mit", "nach",
        "nicht", "noch", "oder", "sich", "sind", "und", "uns", "von", "wann", "was", "welche",
        "werden", "wie", "wir", "wird", "wo", "wurde", "zu", "zum", "zur"
    }),
    "es": frozenset({
        "al", "algo", "aquí", "aunque", "como", "con", "cuando", "del", "donde", "dos", "el",
        "entre", "es", "esa", "ese", "eso", "esta", "este", "esto", "está", "fue", "fueron",
        "gracias", "han", "hay", "hemos", "hoy", "la", "las", "le", "les", "lo", "los", "mi", "muy",
        "más", "nada", "necesito", "ni", "nos", "para", "pero", "por", "porque", "puede", "pueden",
        "que", "quiero", "se", "ser", "sobre", "son", "su", "sus", "también", "tengo", "tiene",
        "tienen", "todo", "tres", "tu", "un", "una", "y", "ya"
    }),
    "pt": frozenset({
        "agora", "ainda", "alguem", "alguém", "ali", "antes", "ao", "aos", "aqui", "as", "até",
        "boa", "cadê", "com", "como", "consigo", "da", "das", "depois", "deu", "do", "dois", "dos",
        "e", "em", "entao", "então", "era", "esta", "estamos", "estava", "este", "estou", "está",
        "eu", "ficou", "fiz", "foi", "gostaria", "hoje", "isso", "isto", "ja", "já", "mais", "mas",
        "meu", "meus", "minha", "minhas", "muito", "na", "nada", "nao", "nas", "nenhum", "nenhuma",
        "ninguem", "ninguém", "noite", "nos", "nossa", "nosso", "não", "o", "obrigada", "obrigado",
        "olá", "onde", "ontem", "os", "para", "pela", "pelo", "pode", "podem", "por", "porque",
        "pra", "preciso", "quando", "que", "quero", "sao", "se", "ser", "seu", "sou", "sua", "são",
        "tambem", "também", "tarde", "tem", "tenho", "três", "tudo", "tá", "um", "uma", "vc", "vcs",
        "voce", "voces", "você", "vocês", "é"
    }),
    "it": frozenset({
        "abbiamo", "adesso", "agli", "alla", "alle", "anche", "ancora", "avete", "che", "ci",
        "ciao", "col", "come", "con", "da", "dagli", "dal", "dalla", "dallo", "degli", "dei", "del",
        "della", "delle", "dello", "deve", "devo", "devono", "di", "dove", "e", "ed", "era", "fra",
        "già", "gli", "grazie", "ha", "hai", "hanno", "ho", "ieri", "il", "la", "le", "lo", "mai",
        "mi", "mia", "mio", "molto", "ne", "negli", "nel", "nell", "nella", "non", "o", "oggi",
        "per", "perche", "più", "poco", "quando", "questa", "questo", "scusa", "sempre", "si",
        "sono", "stata", "stato", "su", "sua", "sul", "sulla", "sulle", "tra", "tuo", "un", "una",
        "uno", "voglio", "vorrei", "è"
    }),
    "nl": frozenset({
        "aan", "dat", "deze", "door", "een", "het", "is", "maar", "met", "naar", "niet", "ook",
        "op", "te", "van", "voor", "worden", "wordt", "zijn"
    }),
    "sv": frozenset({
        "appen", "aterbetala", "aterbetalning", "att", "behover", "behöver", "blivit", "debiterade",
        "dessa", "detta", "faktura", "fel", "från", "får", "ganger", "gång", "gånger", "gör",
        "göra", "hittar", "hjalp", "hjalpa", "hjälp", "hjälpa", "här", "installningarna",
        "installningen", "inställningarna", "inställningen", "inte", "jag", "kommer", "kraschar",
        "kvittot", "losenord", "lösenord", "mig", "min", "mitt", "måste", "nar", "när", "nästa",
        "och", "också", "om", "oppnar", "paket", "ska", "skicka", "skulle", "sparningen",
        "spårningen", "säger", "till", "tva", "två", "upp", "uppdaterats", "utan", "vi", "vill",
        "är", "återbetala", "återbetalning", "öppnar"
    }),
    "ro": frozenset({
        "aceasta", "această", "acest", "acesta", "acum", "ale", "care", "dar", "din", "după",
        "este", "foarte", "fost", "fără", "lui", "mi", "nu", "pentru", "până", "sunt", "să",
        "trebuie", "vreau", "vă", "în", "și", "ți"
    }),
    "bn": frozenset({
        "abar", "ajke", "akhon", "amader", "amake", "amar", "ami", "amra", "apnake", "apnar",
        "apnara", "apni", "ar", "asbe", "bhai", "bhalo", "bolte", "bolun", "chai", "chaina",
        "dhonnobad", "dilam", "dite", "diye", "diyechi", "dorkar", "duibar", "ei", "eita", "ekbar",
        "ekhon", "ekhono", "ekta", "ferot", "geche", "gese", "hobe", "hocche", "hoise", "hoye",
        "hoyeche", "hoyni", "jabe", "jodi", "jonno", "kalke", "keno", "keu", "kharap", "khub", "ki",
        "kibhabe", "kichu", "kintu", "kivabe", "kobe", "kokhon", "korbo", "korchi", "kore",
        "koreche", "korechi", "koren", "korlam", "korsi", "korte", "korun", "kothay", "koto",
        "lagbe", "moddhe", "nai", "niye", "oi", "oita", "onek", "ota", "pabo", "paini", "parben",
        "parbo", "parchi", "parchina", "peyechi", "sathe", "shathe", "shob", "shomossa", "somossa",
        "tader", "tahole", "taka", "theke", "tomake", "tomar", "tomra", "tumi", "valo"
    }),
    "az": frozenset({
        "amma", "ancaq", "artiq", "artıq", "bir", "biz", "bu", "cox", "daha", "deyil", "də", "eger",
        "görə", "həm", "hər", "ile", "ilə", "isə", "kimi", "lakin", "mən", "nə", "olan", "olmasa",
        "olub", "onlar", "siz", "sonra", "sən", "ucun", "var", "ve", "və", "yalniz", "yalnız",
        "yox", "yoxdur", "çox", "üçün", "əgər"
    }),
}
SHORT_SWEDISH_WORDS = frozenset({
    "abonnemanget", "aterbetalning", "atkomst", "behover", "behöver", "betalningen", "fakturan",
    "felmeddelande", "glomt", "glömt", "inloggningen", "installningen", "inställningen", "kvitto",
    "kvittot", "losenord", "lösenord", "sparningen", "spårningen", "återbetalning", "åtkomst"
})
NORDIC_OVERLAP_WORDS = frozenset({
    "får", "hej", "ja", "jo", "kommer", "mig", "min", "nej", "om", "skulle", "tack", "vi"
})

# Letters ordinary English does not use: the signal for a Latin language no list covers.
_NON_EN_DIACRITICS = frozenset(
    "àâäãáåçéèêëíìîïñóòôöõøúùûüýÿßæœ"          # Western European
    "ăâîșțşţ"                                   # Romanian
    "ąćęłńśźż"                                  # Polish
    "čďěňřšťůž"                                 # Czech / Slovak
    "őű"                                        # Hungarian
    "ğı"                                        # Turkish (matched after lowercasing)
    "āēģīķļņūž"                                 # Baltic
    "đ"                                         # Serbo-Croatian / Vietnamese
    "ə"                                         # Azerbaijani
)
# A word more than one list claims says "not English" without saying which language, so it can
# never name a language on its own. The Nordic words join it because Danish (no list) shares them.
_SHARED_WORDS = frozenset(
    {w for words in STOPWORDS.values() for w in words
     if sum(w in other for other in STOPWORDS.values()) > 1} | NORDIC_OVERLAP_WORDS)
_EN_ONLY_WORDS = STOPWORDS["en"] - _SHARED_WORDS
# Foreign function words that are also ordinary English words: a repeat counts once, so
# "do more, do less" cannot clear the two-hit bar by itself.
_EN_COLLISION_WORDS = frozenset({"come", "son", "do", "care", "todo", "im", "per", "plus"}) & {
    w for lang, words in STOPWORDS.items() if lang != "en" for w in words}

NON_EN_DIACRITIC_RATE = 0.02          # above it, the letters alone say "not English"
ENGLISH_RESCUE_DIACRITIC_RATE = 0.06  # below it, English function words may outvote them

_WORD = re.compile(r"[^\W\d_]+")
# Dotted or @-joined identifiers (`github.com`, `v1.2.3`) are not prose; the lookbehind keeps the
# match linear on long runs of word characters.
_IDENTIFIER = re.compile(r"(?<![\w-])[\w-]*(?:[.@][\w-]+)+")
# A line with code syntax is not prose in any language.
_CODE_LINE = re.compile(r"[=;{}\[\]]|\w\(")
# A token joining letters/digits with `.`, `_`, `/` or `\` is a name or a compound.
_JOINED = re.compile(r"[^\W_][._/\\][^\W_]")
# Letter runs; all-caps ones inside mixed-case text are acronyms (`MON DES EST LA`).
_LETTER_RUN = re.compile(r"[^\W\d_]{2,}")
# All-caps evidence must include a word this long, and a matched stopword this long (or
# non-English letters), to be more than acronym-shaped (upstream measured both bars).
_SHOUTED_MIN_WORD = 5
_SHOUTED_MIN_STOPWORD = 4


class _LatinEvidence(NamedTuple):
    language: Optional[str]     # None: undecided
    diacritic_rate: float
    looks_non_english: bool


def _english_rescued(words: list[str], diacritic_rate: float) -> bool:
    """Two distinct English-only function words and at most one word with a non-English letter
    outvote a marginal diacritic rate (one loanword such as `café` is not a foreign vocabulary)."""
    if diacritic_rate >= ENGLISH_RESCUE_DIACRITIC_RATE:
        return False
    distinct = set(words)
    if len(distinct & _EN_ONLY_WORDS) < 2:
        return False
    return sum(1 for w in distinct if any(ch in _NON_EN_DIACRITICS for ch in w)) <= 1


def _latin_evidence(text: str) -> _LatinEvidence:
    """Language guess for Latin-script text from function words and non-English letters.

    A non-English language is named only when it matched a word no other list claims and beats
    English by a margin; fewer than four words name nothing (except distinctive Swedish).
    """
    # 'İ'.lower() is 'i' plus a combining dot, which no word list holds.
    words = _WORD.findall(_IDENTIFIER.sub(" ", text).replace("İ", "i").lower())
    lowered = text.lower()
    diacritic_rate = sum(1 for ch in lowered if ch in _NON_EN_DIACRITICS) / max(1, len(lowered))
    non_english = diacritic_rate >= NON_EN_DIACRITIC_RATE
    distinct = set(words)
    nordic_overlap = bool(distinct & NORDIC_OVERLAP_WORDS) and not distinct & _EN_ONLY_WORDS
    if 1 < len(words) < 4 and distinct & SHORT_SWEDISH_WORDS:
        return _LatinEvidence("sv", diacritic_rate, non_english)
    if len(words) < 4:
        return _LatinEvidence(None, diacritic_rate, non_english or nordic_overlap)

    counts = Counter(words)
    scores = {lang: sum(1 if w in _EN_COLLISION_WORDS else n
                        for w, n in counts.items() if w in stop)
              for lang, stop in STOPWORDS.items()}
    en = scores["en"]
    evidenced = {lang: score for lang, score in scores.items()
                 if lang != "en" and any(w not in _SHARED_WORDS for w in distinct & STOPWORDS[lang])}
    best_lang, best = max(evidenced.items(), key=lambda kv: kv[1], default=(None, 0))

    language = None
    if best_lang and best >= max(2, en + 2):
        language = best_lang
    elif (best_lang == "sv" and "inte" in words and "kan" in words
          and words[0] in {"kan", "jag", "vi"} and en <= 1):
        language = best_lang                     # "kan inte logga in": `in` is the one English hit
    elif best_lang and non_english and best >= max(2, en):
        language = best_lang
    elif en and (not non_english or _english_rescued(words, diacritic_rate)):
        language = "en"
    return _LatinEvidence(language, diacritic_rate,
                          non_english or (language is None and nordic_overlap))


def _shouted(text: str) -> bool:
    """A cased text written entirely in capitals (caseless scripts are not shouting)."""
    return any(ch.isupper() for ch in text) and not any(ch.islower() for ch in text)


def _shouted_evidence(tokens: list[str], language: str, diacritic_rate: float) -> bool:
    """Whether an all-caps text's evidence for `language` is more than acronym-shaped tokens."""
    if not any(len(t) >= _SHOUTED_MIN_WORD for t in tokens):
        return False
    if diacritic_rate >= NON_EN_DIACRITIC_RATE:
        return True
    matched = {t.lower() for t in tokens} & STOPWORDS.get(language, frozenset())
    return any(len(w) >= _SHOUTED_MIN_STOPWORD for w in matched)


def _blank_caps(text: str) -> str:
    """`text` with every all-caps letter run replaced by one space."""
    return _LETTER_RUN.sub(lambda m: " " if m.group().isupper() else m.group(), text)


def _named_prose_language(segment: str) -> Optional[str]:
    """Foreign language one line names as prose, else None.

    Four words, a language the Latin evidence names, and two *different* words of it; code
    lines, joined compounds and acronyms are not words, and an all-caps line must also clear the
    shouting bar.
    """
    if not segment.strip() or _CODE_LINE.search(segment):
        return None
    prose = " ".join(tok for tok in segment.split() if not _JOINED.search(tok))
    shouted = _shouted(prose)
    if not shouted:
        prose = _blank_caps(prose)
    tokens = _WORD.findall(prose)
    if len(tokens) < 4:
        return None
    evidence = _latin_evidence(prose)
    language = evidence.language
    if language in (None, "en"):
        return None
    if shouted and not _shouted_evidence(tokens, language, evidence.diacritic_rate):
        return None
    if len({w.lower() for w in tokens} & STOPWORDS.get(language, frozenset())) < 2:
        return None
    return language


# ------------------------------------------------------------------------------------- states

# Detection reads the first this-many characters of the flattened state, and of each line.
MAX_CHARS = 4000
# Nesting deeper than this is not read (upstream's bound).
_MAX_DEPTH = 6


def _leaves(state: Any, depth: int = 0) -> list[str]:
    """The string values of a state, depth first; mapping keys are field names and are skipped."""
    if depth > _MAX_DEPTH or state is None:
        return []
    if isinstance(state, str):
        return [state]
    if isinstance(state, (bytes, bytearray)):
        try:
            return [bytes(state).decode("utf-8")]
        except UnicodeDecodeError:
            return []
    if isinstance(state, Mapping):
        children = state.values()
    elif isinstance(state, (list, tuple)):
        children = state
    else:
        return []
    return [leaf for child in children for leaf in _leaves(child, depth + 1)]


def state_text(state: Any, max_chars: int = MAX_CHARS) -> str:
    """The leaves joined by spaces, cut to `max_chars` (leaves past the budget are not read)."""
    parts: list[str] = []
    budget = max_chars
    for leaf in _leaves(state):
        if budget <= 0:
            break
        if len(leaf) > budget:
            parts.append(leaf[:budget])
            break
        parts.append(leaf)
        budget -= len(leaf) + 1
    return " ".join(parts)[:max_chars]


def _detection(script: str, profile: dict[str, float], language: Optional[str], english: bool,
               undecided: bool, diacritic_rate: float, non_latin: float) -> dict[str, Any]:
    """The detection dict in upstream's key order."""
    return {"script": script, "script_profile": profile, "language": language,
            "is_english": english, "language_undecided": undecided,
            "diacritic_rate": diacritic_rate, "non_latin_fraction": non_latin,
            "mixed_segment": None}


def _analyse_text(text: str) -> dict[str, Any]:
    """Detection for one flattened string (no per-line or per-value scan)."""
    counts = _script_counts(text)
    profile = _script_profile(counts)
    script = _dominant_script(counts)
    non_latin = round(1.0 - profile.get("latin", 0.0), 4) if profile else 0.0
    n_non_latin = round(non_latin * sum(ch.isalpha() for ch in text))
    if (script == "latin" and _non_latin_words(text)
            and _non_latin_carries(non_latin, n_non_latin)):
        script = max((s for s in profile if s != "latin"), key=profile.get)
    if script == "unknown":
        return _detection("unknown", profile, None, True, True, 0.0, 0.0)
    if script != "latin":
        return _detection(script, profile, None, False, True, 0.0, non_latin)

    evidence = _latin_evidence(text)
    language = evidence.language
    # Acronyms are not words. Both bars take evidence away from the Latin letters, so neither
    # applies when a non-Latin script carries the text.
    if language not in (None, "en") and not _non_latin_carries(non_latin, n_non_latin):
        if _shouted(text):
            if not _shouted_evidence(_WORD.findall(text), language, evidence.diacritic_rate):
                language = None
        else:
            caps = [m.group() for m in _LETTER_RUN.finditer(text) if m.group().isupper()]
            if caps and not any(len(c) >= _SHOUTED_MIN_WORD for c in caps):
                language = _latin_evidence(_blank_caps(text)).language
    undecided = language is None
    english = language == "en" or (undecided and not evidence.looks_non_english)
    return _detection("latin", profile, language, english, undecided,
                      round(float(evidence.diacritic_rate), 4), non_latin)


def _foreign_segment(state: Any) -> Optional[tuple[str, str]]:
    """(language, stripped line) of the first line any leaf names as foreign prose, else None.

    Reads at most `MAX_CHARS` characters over all lines, like the whole-state read.
    """
    seen = 0
    for leaf in _leaves(state):
        for line in leaf.split("\n"):
            if seen >= MAX_CHARS:
                return None
            line = line[:MAX_CHARS - seen]
            seen += len(line)
            language = _named_prose_language(line)
            if language:
                return language, line.strip()
    return None


# Shortest line that can carry four words (three separators) or ten letters.
_MIN_VALUE_LINE = 7


def _foreign_value(leaf: str) -> Optional[dict[str, Any]]:
    """Detection of the line of `leaf` that is most clearly not English (most letters), or None.

    A line counts when it names a foreign language as prose, carries non-Latin words and ten
    letters, or has a non-English letter rate over four words. Each line is read up to
    `MAX_CHARS` characters, independently of the other values.
    """
    best_letters = -1
    best: Optional[dict[str, Any]] = None
    for line in leaf.split("\n"):
        if len(line) < _MIN_VALUE_LINE:
            continue
        sample = line[:MAX_CHARS]
        if not sample.strip() or _CODE_LINE.search(sample):
            continue
        det = _analyse_text(sample)
        if det["is_english"]:
            continue
        named = (det["language"] not in (None, "en")
                 and _named_prose_language(sample) is not None)
        if not named:
            if det["script"] not in ("latin", "unknown"):
                if not (_non_latin_words(sample)
                        and sum(ch.isalpha() for ch in sample) >= NON_LATIN_MIN_LETTERS):
                    continue
            elif not (float(det["diacritic_rate"]) >= NON_EN_DIACRITIC_RATE
                      and len(_WORD.findall(sample)) >= 4):
                continue
        letters = sum(ch.isalpha() for ch in sample)
        if letters > best_letters:
            best_letters, best = letters, det
    return best


def analyse(state: Any) -> dict[str, Any]:
    """Upstream `laya.lang.analyse(state)`: the `routing.detection` dict for a state.

    Keys, in order: script, script_profile, language, is_english, language_undecided,
    diacritic_rate, non_latin_fraction, mixed_segment. `state` is a string, bytes, a mapping
    or a list/tuple (nested up to six levels); anything else has no text.
    """
    result = _analyse_text(state_text(state))
    if result["script"] == "latin" and result["is_english"]:
        # The part a question is about may be a short foreign line inside an English payload.
        leaves = _leaves(state)
        if len(leaves) > 1 or any("\n" in leaf for leaf in leaves):
            found = _foreign_segment(state)
            if found:
                result.update(language=found[0], is_english=False, language_undecided=False,
                              mixed_segment=found[1])
    if isinstance(state, (str, bytes, bytearray)) or state is None or not result["is_english"]:
        return result
    # A structured state can still hide a foreign value past the segment budget, or in a script
    # the word lists do not name: read every value on its own.
    best_letters = -1
    best: Optional[dict[str, Any]] = None
    for leaf in _leaves(state):
        det = _foreign_value(leaf)
        if det is None:
            continue
        letters = sum(ch.isalpha() for ch in leaf[:MAX_CHARS])
        if letters > best_letters:
            best_letters, best = letters, det
    if best is not None:
        result.update(language=best["language"], is_english=False,
                      language_undecided=best["language_undecided"])
    return result
