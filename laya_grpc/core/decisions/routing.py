"""Which checkpoint answers a request, and the `routing` block that explains the choice.

Upstream `laya serve` 0.4.15 returns `routing = {model, repo, reason, detection, workflow}` with
every answer, and clients read it, so the choice, the reason text and the detection dict must be
upstream's exactly. This module re-implements `laya.serve._resolve_model` (the `model` field) and
`laya.router.Router._route` (the precedence) over a `RouteTable` that stands for upstream's
`Router.models` registry. It is pure: no checkpoint is loaded, no torch imported, so the gateway
can route before it asks the inference service for anything.

Precedence (`route`): explicit model > task > typed-decisions workflow (only with `auto_task`,
exact question-id set) > lang > lang_guess (the call's, then the server's) > detection of the
state (`langdetect.analyse`) > the table's default.
"""
from __future__ import annotations

import logging

import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from ..errors import Kind, LayaError
from .langdetect import analyse
from ..runtime.logs import clip, clip_repr

log = logging.getLogger("laya_grpc.core.decisions.routing")

# Upstream ships the three checkpoints in one Hub repo; `routing.repo` shows `repo/subfolder`.
BUNDLE_REPO = "convaiinnovations/laya"
BUILTIN_SOURCES = {
    "english": BUNDLE_REPO,
    "multilingual": BUNDLE_REPO + "/multilingual",
    "typed-decisions": BUNDLE_REPO + "/typed-decisions",
}
# Standalone Hub ids a client may send as `model` to pin a checkpoint. The bundle id itself means
# "let the router choose", not "english".
PUBLISHED_MODEL_IDS = {
    "convaiinnovations/laya-multilingual": "multilingual",
    "convaiinnovations/laya-typed-decisions": "typed-decisions",
}
ALIASES = {
    "en": "english", "laya": "english", "default": "english",
    "multi": "multilingual", "ml": "multilingual", "laya-multilingual": "multilingual",
    "typed": "typed-decisions", "typed_decisions": "typed-decisions",
    "laya-typed-decisions": "typed-decisions", "decisions": "typed-decisions",
}
# Upstream `Router`'s default for text whose language detection abstains.
DEFAULT_MODEL = "multilingual"

# Question-id sets of the four workflows the typed-decisions checkpoint was fine-tuned on.
TYPED_DECISION_WORKFLOWS = {
    "agent_trace_observability": frozenset({"action", "needs_review", "outcome", "risk", "urgency"}),
    "customer_service": frozenset({"action", "category", "churn_risk", "needs_human", "urgency"}),
    "invoice_processing": frozenset({"discrepancy_severity", "disposition", "duplicate",
                                     "matches_order", "urgency"}),
    "security_incidents": frozenset({"credential_compromise", "disposition", "severity",
                                     "true_positive", "urgency"}),
}

# A registered checkpoint's name once trimmed and lowercased; no `/`, which marks a source.
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

# Primary language subtags the English checkpoint reads; any other code is non-English.
_ENGLISH_SUBTAGS = ("en", "eng", "english")
# Codes that name no language (`LANG=C`, ISO 639-2 `und`/`zxx`/`mul`): they abstain.
_LANGUAGE_AGNOSTIC_CODES = ("c", "posix", "und", "zxx", "mul")

Source = Union[str, Sequence[Optional[str]]]


def canonical_name(name: Any) -> str:
    """Trimmed, lowercased, alias-resolved spelling of a checkpoint name (not yet checked)."""
    key = str(name).strip().lower()
    return ALIASES.get(key, key)


def source_text(source: Source) -> str:
    """What `routing.repo` shows for a source: the path or repo id, or `repo/subfolder`."""
    if isinstance(source, str):
        return source
    repo, subfolder = (list(source) + [None])[:2]
    return "%s/%s" % (repo, subfolder) if subfolder else repo


def _unknown_model(name: Any, names: Iterable[str]) -> str:
    return "unknown model %r; choose one of %s (or an alias: %s)" % (
        name, sorted(names), sorted(ALIASES))


@dataclass(frozen=True)
class RouteTable:
    """The checkpoints a server routes between: canonical name -> source shown in `routing.repo`.

    Always holds the three built-in names (re-pointed when the deployment gives them a source)
    plus any extra names registered beside them. `default` answers states with no language
    evidence.
    """
    sources: Mapping[str, str] = field(default_factory=lambda: dict(BUILTIN_SOURCES))
    default: str = DEFAULT_MODEL
    strict_model: bool = False     # an unknown `model` is NOT_FOUND instead of auto-routed (--strict-model)

    @classmethod
    def build(cls, models: Optional[Mapping[Any, Source]] = None,
              default: Optional[str] = None, strict_model: bool = False) -> "RouteTable":
        """Table for `models` (built-in or extra name -> source) and a `LAYA_DEFAULT_MODEL` value.

        Checks in upstream's start-up order with upstream's texts (`laya serve` exits with them):
        the default first, against the built-in names and the extra names as written, then each
        name's spelling. A source starting with `~` is a home path and is shown expanded.
        """
        models = dict(models or {})
        default_key = DEFAULT_MODEL
        if default is not None and default.strip():
            default_key = canonical_name(default)
            if default_key not in BUILTIN_SOURCES and default_key not in models:
                raise LayaError(Kind.INVALID, "invalid LAYA_DEFAULT_MODEL %r: %s" % (
                    default.strip(), _unknown_model(default, BUILTIN_SOURCES)))
        sources = dict(BUILTIN_SOURCES)
        for name, source in models.items():
            key = canonical_name(name)
            if key not in BUILTIN_SOURCES:
                if not isinstance(name, str) or not _NAME_RE.match(key):
                    raise LayaError(Kind.INVALID, "invalid checkpoint name %r: use lowercase letters, "
                                    "digits, '.', '_' or '-', starting with a letter or digit" % (name,))
                if key == "auto":
                    raise LayaError(Kind.INVALID, "invalid checkpoint name %r: 'auto' means automatic "
                                    "routing in every model= argument" % (name,))
            if not isinstance(source, (str, tuple, list)):
                raise LayaError(Kind.INVALID, "checkpoint source for %r must be a repo id, a local path "
                                "or a (repo, subfolder) pair, got %s" % (name, type(source).__name__))
            if isinstance(source, str) and source.startswith("~"):
                source = os.path.expanduser(source)
            sources[key] = source_text(source)
        return cls(sources=sources, default=default_key, strict_model=strict_model)

    def resolve(self, name: Any) -> str:
        """Canonical name of a checkpoint in this table, or upstream's 422 naming the choices."""
        key = canonical_name(name)
        if key in self.sources:
            return key
        raise LayaError(Kind.INVALID, _unknown_model(name, self.sources))


def _names_a_source(text: str) -> bool:
    """A path (`./ckpt`, `~/ckpt`, `a\\b`) or an `org/repo` id rather than a checkpoint name."""
    if not text:
        return False
    return text[0] in ".~" or "/" in text or "\\" in text


def resolve_model(model_field: Any, table: RouteTable) -> Optional[str]:
    """The request's `model` field as a canonical checkpoint name, or None to auto-route
    (`resolve_model_named`'s first half)."""
    return resolve_model_named(model_field, table)[0]


def resolve_model_named(model_field: Any, table: RouteTable) -> tuple[Optional[str], Optional[str]]:
    """(canonical checkpoint name or None to auto-route, the unknown name that was auto-routed).

    Empty values, the bundle id and names this server does not know (a Jev id such as `jev-1`)
    auto-route, as upstream does; the second value then names the unknown one so the fronts can
    say so (the HTTP header X-Laya-Unknown-Model, the gRPC trailer laya-unknown-model; the answer's
    routing.reason stays upstream's). With `table.strict_model` an unknown name is
    LayaError(NOT_FOUND) instead. A path or an unpublished `org/repo` id is a checkpoint this
    server cannot load: LayaError(INVALID) with upstream's text.
    """
    if not model_field:
        return None, None
    text = str(model_field).strip()
    published = PUBLISHED_MODEL_IDS.get(text.lower())
    if published is not None:
        return published, None
    if text.lower() == BUNDLE_REPO:
        return None, None
    try:
        return table.resolve(model_field), None
    except LayaError as error:
        if _names_a_source(text):
            raise LayaError(Kind.INVALID, "%s, or omit model to let the router choose"
                            % clip(error.detail, 1000), "model") from None
        if table.strict_model:
            raise LayaError(Kind.NOT_FOUND, "unknown model %s; this server serves: %s (or omit model to let "
                            "the router choose)" % (clip_repr(text), ", ".join(sorted(table.sources))),
                            "model") from None
        # upstream's answer (auto-route) stays the contract; a misspelling must not pass unseen
        log.warning("request names unknown model %s; auto-routing as upstream does (this server knows: %s)",
                    clip_repr(text), ", ".join(sorted(table.sources)))
        return None, text


def check_language_param(key: str, value: Any) -> Optional[str]:
    """A request's `lang` / `lang_guess`: a code string or None, else upstream's 422.

    A JSON `true` would otherwise stringify into the (non-English) code "true".
    """
    if value is None or isinstance(value, str):
        return value
    raise LayaError(Kind.INVALID, '%s must be a language code string such as "de", or null' % key, key)


def english_from_code(code: Optional[str]) -> Optional[bool]:
    """Whether a language code names English (`en`, `EN-us`, `en_US.UTF-8`); None abstains."""
    if code is None:
        return None
    text = str(code).strip().lower()
    if not text:
        return None
    primary = text.split(".", 1)[0].replace("_", "-").split("-", 1)[0]
    if not primary or primary in _LANGUAGE_AGNOSTIC_CODES:
        return None
    return primary in _ENGLISH_SUBTAGS


def match_workflow(question_ids: Iterable[Any]) -> Optional[str]:
    """The typed-decisions workflow whose exact question-id set this is, else None."""
    ids = set(question_ids)
    for name, signature in TYPED_DECISION_WORKFLOWS.items():
        if ids == signature:
            return name
    return None


@dataclass(frozen=True)
class Routing:
    """A routing decision; `block()` is the response's `routing` object.

    `lang` is what upstream hands the checkpoint as `system_one(lang=...)` (it selects
    per-language temperatures): the request's `lang` when given, even one that abstained from
    routing, else the detected language.
    """
    model: str
    repo: Optional[str]
    reason: str
    detection: Optional[dict]
    workflow: Optional[str]
    lang: Optional[str] = None

    def block(self) -> dict:
        return {"model": self.model, "repo": self.repo, "reason": self.reason,
                "detection": self.detection, "workflow": self.workflow}


def route(table: RouteTable, state: Any, question_ids: Iterable[Any], *,
          model: Optional[str] = None, task: Any = None, lang: Optional[str] = None,
          lang_guess: Optional[str] = None, auto_task: bool = False,
          server_lang_guess: Optional[str] = None) -> Routing:
    """Choose the checkpoint for one state, with upstream `Router._route`'s precedence and texts.

    `model` is `resolve_model`'s result; `task` is the request's raw `task` value (unknown: 422);
    `lang` / `lang_guess` must be code strings or None (422 otherwise, checked first, as upstream
    checks them before routing); `auto_task` is `LAYA_AUTO_TASK`; `server_lang_guess` is a
    deployment-wide code hint, upstream's `Router(lang_guess=...)`.
    """
    check_language_param("lang", lang)
    check_language_param("lang_guess", lang_guess)

    def decided(key: str, reason: str, detection: Optional[dict] = None,
                workflow: Optional[str] = None) -> Routing:
        detected = detection.get("language") if detection else None
        return Routing(model=key, repo=table.sources.get(key), reason=reason, detection=detection,
                       workflow=workflow, lang=lang if lang is not None else detected or None)

    if model is not None:
        return decided(table.resolve(model), "explicit model=%r" % (model,))
    if task is not None:
        wanted = "typed-decisions" if str(task).lower().replace("-", "_") == "typed_decisions" else task
        return decided(table.resolve(wanted), "explicit task=%r" % (task,))

    workflow = match_workflow(question_ids)
    if workflow and auto_task:
        return decided("typed-decisions",
                       "question ids match the %r typed-decisions workflow" % workflow,
                       workflow=workflow)

    english = english_from_code(lang)
    if english is not None:
        return decided("english" if english else "multilingual", "explicit lang=%r" % lang,
                       workflow=workflow)

    for source, hint in (("lang_guess", lang_guess), ("Router(lang_guess=...)", server_lang_guess)):
        english = english_from_code(hint)
        if english is not None:
            return decided("english" if english else "multilingual",
                           "%s: the caller identified this as %s text"
                           % (source, "English" if english else "non-English"),
                           workflow=workflow)

    det = analyse(state)
    if det["script"] == "unknown":
        key = table.default
        reason = "no letters detected in state; using default (%s)" % key
    elif det["script"] != "latin":
        key = "multilingual"
        reason = ("non-Latin script (%s, %.0f%% of letters); the English checkpoint cannot read it"
                  % (det["script"], 100 * float(det["non_latin_fraction"])))
    elif not det["is_english"]:
        key = "multilingual"
        if det["mixed_segment"]:
            reason = ("Latin script, mostly English, but a line or field reads as %r (%r); "
                      "the English checkpoint cannot read it"
                      % (det["language"], det["mixed_segment"][:60]))
        elif det["language"]:
            reason = "Latin script but language looks like %r, not English" % det["language"]
        else:
            reason = ("Latin script, language not identified but %.0f%% non-English letters; "
                      "not safe for the English checkpoint" % (100 * float(det["diacritic_rate"])))
    elif det["language_undecided"]:
        key = table.default
        reason = ("Latin script, language not identified and no non-English letters; "
                  "using default (%s)" % key)
    else:
        key = "english"
        reason = "English Latin text"
    return decided(key, reason, detection=det, workflow=workflow)
