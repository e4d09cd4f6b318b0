"""Routing parity with upstream laya 0.4.15: detection dicts, model resolution, route choices.

Upstream is run directly: `laya.lang.analyse` for detection, `laya.serve._resolve_model` and
`_validate_language_param` for the request fields, and a real `laya.router.Router` over local
directory sources whose checkpoints are stand-in agents attached with `Router.attach`, so
`Router.predict` runs its real routing and hands the stand-in the `lang` it would hand a
checkpoint. Nothing is loaded; routing never needs a checkpoint.
"""
from __future__ import annotations

import json
import random
import unicodedata

import pytest

fastapi = pytest.importorskip("fastapi")
up_lang = pytest.importorskip("laya.lang")
up_router = pytest.importorskip("laya.router")
up_serve = pytest.importorskip("laya.serve")

from laya_grpc.core.decisions import langdetect
from laya_grpc.core.decisions import routing  # noqa: E402
from laya_grpc.core.errors import Kind, LayaError  # noqa: E402

# ------------------------------------------------------------------------------------ corpus

HAND_WRITTEN = [
    # English
    "I was charged twice for my order. Please refund the duplicate today.",
    "Why hasn't my card been delivered?",
    "cannot login",
    "Hello",
    "do more, do less, do it now, do it well",
    "Please call José about the café résumé tomorrow.",
    "Zoë and Björn met Müller at the Café de Flore in Saint-Étienne.",
    "The naïve coördinator's façade was déjà vu for Chloë and Renée.",
    "Set α to 0.05 and β to 0.1 before you run the test",
    "Our contact Дмитрий Петрович Савицкий will call you",
    "Pronounced [vlɐˈdʲimʲɪr] in the original, Влади́мир is the name",
    "Check github.com and user@acme.com for v1.2.3 of the U.S.A. build",
    "The os.path join fails when el is None and non_english is set",
    "Nav/Com OS/2 C:\\DOS\\mode ESA/UN are all fine here",
    "COM COM COM COM radio listing for the evening",
    "ticket: order #4411 status shipped, ETA Monday",
    "I'm stuck, the app keeps crashing when I open settings!!!",
    # Latin-script non-English
    "Mein Konto wurde zweimal belastet",
    "Ich habe heute mein Passwort vergessen und kann mich nicht anmelden",
    "sag mir das HEUTIGE DATUM bitte",
    "WIE SPÄT IST ES IN KÖLN",
    "WIE SPAET IST ES IN KOELN",
    "reduzieren der helligkeit der lichter",
    "Bonjour, je veux annuler ma commande pour la deuxième fois",
    "Je n'ai pas reçu mon colis et je suis très déçu",
    "quiero cancelar mi PEDIDO POR FAVOR",
    "Hola, necesito ayuda con mi cuenta porque no puedo entrar",
    "Quero cancelar",
    "Esqueci minha senha",
    "Voce pode me mandar a nota fiscal?",
    "Deu erro 500 no endpoint de login depois do update",
    "Não consigo acessar minha conta desde ontem, já tentei tudo",
    "Ciao, vorrei sapere quando arriva il mio ordine",
    "la fattura del mese scorso",
    "Ik heb mijn wachtwoord niet ontvangen, kunnen jullie het opnieuw sturen",
    "Nie mogę zalogować się do konta, proszę o pomoc",
    "Siparişim henüz gelmedi, lütfen yardım edin",
    "İstanbul'da yaşıyorum ve çok mutluyum",
    "Tôi không thể đăng nhập vào tài khoản của mình",
    "Jag kan inte logga in på mitt konto",
    "kan inte logga in",
    "glömt lösenord",
    "hej tack",
    "Jeg kan ikke logge ind på min konto, kan I hjælpe mig",
    "Nu pot să mă conectez la contul meu, vă rog să mă ajutați",
    "ami amar taka ferot chai, kobe pabo",
    "Mən bu sifarişi ləğv etmək istəyirəm, çox sağ olun",
    "Nemohu se přihlásit ke svému účtu, prosím o pomoc",
    "Nem tudok bejelentkezni a fiókomba, kérem segítsenek",
    "Habari, siwezi kuingia kwenye akaunti yangu",
    "Saya tidak bisa masuk ke akun saya",
    "Minulla ei ole pääsyä tililleni",
    "MON DES EST LA",
    "STORES LOS ANGELES LAS VEGAS EL PASO CLOSED",
    "Game tonight: MON DES EST LA at eight",
    "para el uso del sistema",
    # Non-Latin scripts
    "你好，我的订单还没有到",
    "注文がまだ届いていません。確認してください。",
    "カタカナだけ",
    "주문이 아직 도착하지 않았습니다",
    "طلبي لم يصل بعد، أرجو المساعدة",
    "ההזמנה שלי עדיין לא הגיעה",
    "Мой заказ ещё не пришёл, помогите пожалуйста",
    "Моє замовлення ще не надійшло",
    "Η παραγγελία μου δεν έχει φτάσει ακόμα",
    "मेरा ऑर्डर अभी तक नहीं आया है",
    "আমার অর্ডার এখনও আসেনি",
    "என் ஆர்டர் இன்னும் வரவில்லை",
    "คำสั่งซื้อของฉันยังไม่มาถึง",
    "ការបញ្ជាទិញរបស់ខ្ញុំមិនទាន់មកដល់ទេ",
    "ትዕዛዜ ገና አልደረሰም",
    "ჩემი შეკვეთა ჯერ არ მოსულა",
    "Իմ պատվերը դեռ չի հասել",
    "ㄅㄆㄇㄈ 注音符號",
    "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ",
    "ⵜⴰⵎⴰⵣⵉⵖⵜ",
    "ＡＢＣ ｆｕｌｌｗｉｄｔｈ text",
    "ﾊﾝｶｸ ｶﾀｶﾅ",
    "ПРИВЕТ MON DES EST LA",
    "iPhone 15 Pro の注文をキャンセルしたい",
    "Order ABC-123 注文",
    "My order 订单号 12345 has not arrived yet, please check the 物流 status",
    "abc ١٢٣ def",
    "\U0001E4D0\U0001E4D1\U0001E4D2\U0001E4D3",          # Nag Mundari: Unicode 15 letters
    "ok \U00011F04\U00011F05\U00011F06 \U0002EBF0\U0002EBF1",   # Kawi, CJK extension I
    # No letters
    "",
    " ",
    "\n\n",
    "123 456.78",
    "😀😀😀",
    "!!! ??? ...",
    "🇩🇪 🇫🇷 👍🏽",
    # Mixed English + a foreign line
    "Hi team,\nEl cliente dice que no puede entrar a su cuenta desde ayer\nThanks",
    "Customer wrote:\nMein Konto wurde zweimal belastet und ich bin sehr verärgert\nPlease advise.",
    "Traceback (most recent call last):\n  File \"app.py\", line 3\nErro ao processar o pedido do cliente hoje",
    "Summary\nx = la_fonction(el, non)\nNothing else to report",
    "Agent: How can I help?\nUser: Je voudrais annuler mon abonnement s'il vous plaît",
    "Please translate:\n我想取消订单\nThanks",
    # Bytes
    "Mein Konto wurde zweimal belastet".encode("utf-8"),
    b"\xff\xfe not utf-8",
    bytearray("Bonjour je veux annuler ma commande".encode("utf-8")),
    # Structured states
    {"message": "Mein Konto wurde zweimal belastet", "customer": "Hans"},
    {"subject": "Order issue", "body": "I was charged twice, please refund me."},
    {"subject": "Order issue", "body": "Fui cobrado duas vezes, por favor me ajudem com isso"},
    {"name": "José García", "note": "Customer called about the invoice and wants a callback."},
    {"a": 1, "b": None, "c": True, "d": 2.5},
    {"nested": {"deeper": {"text": "Hola, necesito ayuda con mi cuenta porque no puedo entrar"}}},
    {"l1": {"l2": {"l3": {"l4": {"l5": {"l6": {"l7": "Hola, necesito ayuda con mi cuenta"}}}}}}},
    {"l1": {"l2": {"l3": {"l4": {"l5": {"l6": "Hola, necesito ayuda con mi cuenta ya"}}}}}},
    ["I was charged twice.", "Please refund the duplicate."],
    ["Hello, how are you doing today?", "Je voudrais annuler ma commande s'il vous plaît"],
    [{"role": "user", "content": "Mi pedido no ha llegado todavía"},
     {"role": "assistant", "content": "I am sorry to hear that, let me check."}],
    ("a tuple", "con texto en español para el sistema"),
    {"log": "ERROR 500 at /api/login", "comment": "Наш клиент не может войти в систему"},
    {"en": "The customer is angry about the delay and the refund.", "code": "ABC-123"},
    {1: "integer key with English text here", (1, 2): "tuple key"},
    [],
    {},
    {"empty": ""},
    [[["deep list with English text in it and more"]]],
    {"ticket": "WIE SPÄT IST ES IN KÖLN HEUTE", "agent": "Looking into it now for you."},
    {"history": "A" * 10},
    {"short": "José", "other": "Ok"},
    {"x": "la fattura", "y": "del mese"},
]


def _strip_accents(text: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))


_BASES = [
    "Mein Konto wurde zweimal belastet und ich möchte mein Geld zurück",
    "Je n'ai pas reçu ma facture et je voudrais la recevoir aujourd'hui",
    "No he recibido mi pedido y quiero saber cuándo va a llegar",
    "Não recebi o meu pedido e gostaria de saber quando vai chegar",
    "Non ho ricevuto il mio ordine e vorrei sapere quando arriverà",
    "Ik heb mijn bestelling niet ontvangen en wil weten wanneer die komt",
    "Nie otrzymałem zamówienia i chcę wiedzieć, kiedy przyjdzie",
    "Siparişimi almadım ve ne zaman geleceğini öğrenmek istiyorum",
    "Tôi chưa nhận được đơn hàng và muốn biết khi nào nó đến",
    "Jag har inte fått min beställning och vill veta när den kommer",
    "Nu am primit comanda și vreau să știu când va ajunge",
    "I have not received my order and want to know when it will arrive",
    "Я не получил заказ и хочу знать, когда он придёт",
    "我没有收到订单，想知道什么时候到",
    "मुझे मेरा ऑर्डर नहीं मिला और मैं जानना चाहता हूँ कि यह कब आएगा",
    "لم أستلم طلبي وأريد أن أعرف متى سيصل",
]
_ENGLISH_NOTE = "Agent note: the customer has been waiting for a week and we should follow up today."
_TRANSFORMS = [
    lambda s: s,
    str.upper,
    _strip_accents,
    lambda s: " ".join(s.split()[:2]),
    lambda s: " ".join(s.split()[:3]),
    lambda s: "Hello team, please see the message below.\n" + s + "\nThanks a lot.",
    lambda s: {"subject": "Order status", "body": s},
    lambda s: [_ENGLISH_NOTE, s],
    lambda s: {"notes": _ENGLISH_NOTE * 60, "message": s},   # past the 4000-character window
    lambda s: s + " 😀 #123",
    lambda s: "ORDER ID ABC " + s,
]


def _generated() -> list:
    out = [t(s) for s in _BASES for t in _TRANSFORMS]
    rng = random.Random(1234)
    # Word salads drawn from the upstream stopword lists: exercises the margins and tie-breaks.
    langs = list(up_lang._STOP)
    for _ in range(150):
        picks = rng.sample(langs, rng.randint(1, 3))
        words = [rng.choice(sorted(up_lang._STOP[lg])) for lg in picks for _ in range(rng.randint(1, 4))]
        rng.shuffle(words)
        if rng.random() < 0.3:
            words = [w.upper() for w in words]
        out.append(" ".join(words))
    # Random character soups over scripts, diacritics, digits and separators.
    pools = ["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "éüßçñøąłşğıđə",
             "абвгдежзийклмн", "的一是不了人我在有", "αβγδε", "अआइईउ", "ابتثجح", "0123456789",
             " \n\t.,;:!?()[]{}=/\\@-_'", "😀👍🏽", "\u0301\u0308"]
    for _ in range(120):
        n = rng.randint(0, 60)
        chosen = rng.sample(pools, rng.randint(1, 4))
        out.append("".join(rng.choice(rng.choice(chosen)) for _ in range(n)))
    return out


def _boundaries() -> list:
    """States on the edges of upstream's constants: window sizes, letter counts, line lengths."""
    out = []
    english = "please check the status of my order and the account for me today "
    spanish = "Hola, necesito ayuda con mi cuenta porque no puedo entrar"
    for filler in (3930, 3940, 3943, 3944, 3950, 3990, 3999, 4000, 4001, 4010):
        text = (english * 70)[:filler]
        out.append([text, spanish])                       # the 4000-character segment budget
        out.append(text + "\n" + spanish)
        out.append({"note": text, "msg": spanish})
    for k in range(6, 15):                                # non-Latin letters: 10 letters, 10%, 20%
        out.append(english + "привет" + "мир"[: max(0, k - 6)] + "ж" * max(0, k - 9))
        out.append(english[: 40] + " " + "д" * k)
        out.append(english[: 30] + " " + "的" * k)
    for n_latin, n_cyrillic in ((8, 2), (16, 4), (17, 4), (85, 10), (90, 10), (81, 9), (95, 10)):
        latin = ("abcdefghij" * 10)[:n_latin]
        out.append(" ".join(latin[i:i + 5] for i in range(0, n_latin, 5)) + " " + "ж" * n_cyrillic)
    out.append({"a": english * 3, "b": "é é é é"})         # the seven-character value line
    out.append({"a": english * 3, "b": "é é éé"})
    out.append("why does the ñoño show up then, ok")      # English rescue below a 6% letter rate
    out.append("why does the ñoño show up, ok")
    return out


CORPUS = HAND_WRITTEN + _generated() + _boundaries()


def test_corpus_is_broad():
    assert len(CORPUS) >= 150
    verdicts = {(d["script"], d["is_english"], d["language"]) for d in map(up_lang.analyse, CORPUS)}
    assert len(verdicts) > 25


@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_analyse_matches_upstream(index):
    state = CORPUS[index]
    expected = up_lang.analyse(state)
    got = langdetect.analyse(state)
    # json.dumps keeps key order and tells True from 1: the block is served as JSON.
    assert json.dumps(got) == json.dumps(expected), repr(state)[:200]


# ------------------------------------------------------------------------------------ routing

SOURCES = {"english": "/tmp/x/en", "multilingual": "/tmp/x/ml", "typed-decisions": "/tmp/x/td"}
EXTRA = {"papers": "/tmp/x/papers", "Legal.v2": ["org/legal", "v2"]}


class _Stand:
    """Stand-in checkpoint: records the `lang` Router.predict hands to `system_one`."""

    def __init__(self):
        self.langs = []

    def system_one(self, state, questions, lang=None):
        self.langs.append(lang)
        return {}


def _upstream_router(default=None, auto_task=False, server_lang_guess=None):
    models = {**SOURCES, **{k: tuple(v) if isinstance(v, list) else v for k, v in EXTRA.items()}}
    kwargs = {"default": default} if default else {}
    router = up_router.Router(models=models, auto_task_detection=auto_task,
                              lang_guess=server_lang_guess, **kwargs)
    stands = {}
    for name in router.models:
        stands[name] = _Stand()
        router.attach(name, stands[name])
    return router, stands


def _ours_table(default=None):
    return routing.RouteTable.build({**SOURCES, **EXTRA}, default=default)


def _upstream_call(router, stands, state, questions, body):
    """What upstream serve does with one request's routing fields: (routing block, lang) or error."""
    try:
        model = up_serve._resolve_model(body.get("model"), router.resolve)
        kwargs = {}
        if body.get("task") is not None:
            kwargs["task"] = body["task"]
        for key in ("lang", "lang_guess"):
            value = up_serve._validate_language_param(body, key)
            if value is not None:
                kwargs[key] = value
        result = router.predict(state, questions, model=model, **kwargs)
    except fastapi.HTTPException as e:
        return ("error", e.status_code, e.detail)
    except ValueError as e:
        return ("error", 422, str(e))
    routing_block = result["routing"]
    lang = stands[routing_block["model"]].langs[-1]
    return ("ok", json.dumps(routing_block), lang)


def _our_call(table, state, questions, body, auto_task=False, server_lang_guess=None):
    try:
        model = routing.resolve_model(body.get("model"), table)
        decision = routing.route(table, state, questions.keys(), model=model, task=body.get("task"),
                                 lang=body.get("lang"), lang_guess=body.get("lang_guess"),
                                 auto_task=auto_task, server_lang_guess=server_lang_guess)
    except LayaError as e:
        return ("error", e.kind.http_status, e.detail)
    return ("ok", json.dumps(decision.block()), decision.lang)


PLAIN_Q = {"q": {"type": "noul", "instructions": "Is it urgent?"}}
WORKFLOW_Q = {k: {"type": "noul", "instructions": k} for k in
              ("action", "category", "churn_risk", "needs_human", "urgency")}
SUPERSET_Q = dict(WORKFLOW_Q, extra={"type": "noul", "instructions": "x"})
INVOICE_Q = {k: {"type": "noul", "instructions": k} for k in
             ("discrepancy_severity", "disposition", "duplicate", "matches_order", "urgency")}
QUESTION_SETS = [PLAIN_Q, WORKFLOW_Q, SUPERSET_Q, INVOICE_Q, {}]

ROUTE_STATES = [
    "I was charged twice for my order. Please refund the duplicate today.",
    "Mein Konto wurde zweimal belastet und ich bin sehr verärgert",
    "你好，我的订单还没有到",
    "Quero cancelar",
    "12345 !!!",
    "Nie mogę się zalogować dzisiaj rano, źle działa",
    "Zażółć gęślą jaźń",
    "Hi team,\nEl cliente dice que no puede entrar a su cuenta desde ayer\nThanks",
    {"subject": "Refund", "body": "Fui cobrado duas vezes, por favor me ajudem"},
    ["Hello there, how are you doing today?", "Мой заказ ещё не пришёл"],
    ("I was charged twice for my order and I need the refund today, please. This is the second "
     "time this has happened to me this month and it is not ok with me at all.\n"
     "El cliente dice que no puede entrar a su cuenta desde ayer"),
    {"notes": _ENGLISH_NOTE * 60, "message": "Mein Konto wurde zweimal belastet und ich bin sauer"},
    "Hi team,\n" + "El cliente dice que no puede entrar a su cuenta desde ayer y está muy molesto " * 2,
]
MODELS = [None, "", 0, False, "english", " EN ", "Laya", "ML", "typed", "papers", "PAPERS", "legal.v2",
          "convaiinnovations/laya", "CONVAIINNOVATIONS/LAYA-MULTILINGUAL",
          "convaiinnovations/laya-typed-decisions", "jev-1", "gpt-4", 123, "auto", "./ckpt",
          "~/ckpt", "org/repo", "a\\b", ".hidden", "/tmp/x/en", ["a/b"], {"k": "v"}, True]
TASKS = [None, "typed_decisions", "Typed-Decisions", "TYPED_DECISIONS", "multilingual", "en",
         "papers", "bogus", "", 5, True]
LANGS = [None, "de", "en", "EN-us", "en_US.UTF-8", "eng", "english", "C", "POSIX", "C.UTF-8",
         "und", "zxx", "mul", "", "  ", "pt-BR", "_", ".", 1, True, ["en"]]
GUESSES = [None, "fr", "EN", "posix", "", "ja_JP", 0, {"x": 1}]


def _combinations():
    rng = random.Random(99)
    fixed = [
        # each control alone, over every state and question set
        {"model": m} for m in MODELS
    ] + [{"task": t} for t in TASKS] + [{"lang": v} for v in LANGS] + [{"lang_guess": g} for g in GUESSES]
    fixed.append({})
    sampled = []
    for _ in range(400):
        body = {}
        for key, pool, p in (("model", MODELS, 0.3), ("task", TASKS, 0.3),
                             ("lang", LANGS, 0.4), ("lang_guess", GUESSES, 0.4)):
            if rng.random() < p:
                body[key] = rng.choice(pool)
        sampled.append(body)
    return fixed, sampled


FIXED_BODIES, SAMPLED_BODIES = _combinations()
CONFIGS = [(None, False, None), ("english", False, None), ("papers", True, None),
           (None, True, "de"), ("ml", False, "en_US"), (None, False, "C")]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "default=%s,auto_task=%s,guess=%s" % c)
def test_route_matches_upstream(config):
    default, auto_task, server_guess = config
    router, stands = _upstream_router(default, auto_task, server_guess)
    table = _ours_table(default)
    rng = random.Random(CONFIGS.index(config))
    cases = [(s, q, b) for s in ROUTE_STATES for q in (PLAIN_Q, WORKFLOW_Q) for b in FIXED_BODIES]
    cases += [(rng.choice(ROUTE_STATES), rng.choice(QUESTION_SETS), b) for b in SAMPLED_BODIES]
    outcomes = {"ok": 0, "error": 0}
    for state, questions, body in cases:
        expected = _upstream_call(router, stands, state, questions, body)
        got = _our_call(table, state, questions, body, auto_task, server_guess)
        assert got == expected, (state, sorted(questions), body)
        outcomes[expected[0]] += 1
    # Both outcomes are exercised under every configuration.
    assert outcomes["ok"] > 100 and outcomes["error"] > 20


def test_repo_shows_local_directory_and_bundle_sources():
    router, _ = _upstream_router()
    table = _ours_table()
    for name in ("english", "multilingual", "typed-decisions", "papers", "legal.v2"):
        got = routing.route(table, "x", [], model=name)
        assert got.repo == router._route("x", {}, model=name)["repo"]
    assert _ours_table().sources["legal.v2"] == "org/legal/v2"
    hub = up_router.Router()
    for name in ("english", "multilingual", "typed-decisions"):
        assert routing.RouteTable().sources[name] == hub._route("x", {}, model=name)["repo"]


def test_home_path_source_is_expanded_like_upstream():
    expected = up_router.Router(models={"english": "~/ckpt/en"})._route("x", {}, model="en")["repo"]
    got = routing.route(routing.RouteTable.build({"english": "~/ckpt/en"}), "x", [], model="english")
    assert got.repo == expected and not expected.startswith("~")


@pytest.mark.parametrize("models", [
    {"Bad/Name": "/x"}, {"auto": "/x"}, {" AUTO ": "/x"}, {"-lead": "/x"}, {"": "/x"},
    {"ok.name_1-2": "/x"}, {"English": "/x"}, {"ML": ["org/repo", "sub"]}, {"p": 5},
])
def test_registration_errors_match_upstream(models):
    try:
        up_router.Router(models=models)
        expected = None
    except (ValueError, TypeError) as e:
        expected = str(e)
    try:
        routing.RouteTable.build(models)
        got = None
    except LayaError as e:
        assert e.kind is Kind.INVALID
        got = e.detail
    assert got == expected


@pytest.mark.parametrize("raw,extra", [
    ("english", {}), ("ML", {}), ("papers", {"papers": "/x"}), ("Papers", {"papers": "/x"}),
    ("papers", {"Papers": "/x"}), ("bogus", {}), ("bogus", {"papers": "/x"}), ("typed", {}),
])
def test_default_model_matches_upstream(monkeypatch, raw, extra):
    monkeypatch.setenv("LAYA_DEFAULT_MODEL", raw)
    try:
        option = up_serve._default_model_option(extra)
        expected = up_router.Router(models=extra, **option).default
    except (ValueError, TypeError) as e:
        expected = "error: " + str(e)
    try:
        got = routing.RouteTable.build(extra, default=raw).default
    except LayaError as e:
        got = "error: " + e.detail
    assert got == expected


def test_default_table_answers_like_a_default_router():
    router = up_router.Router()
    table = routing.RouteTable()
    for state in ROUTE_STATES:
        expected = dict(router._route(state, {}))
        got = routing.route(table, state, []).block()
        assert json.dumps(got) == json.dumps(expected)
        assert got["repo"].startswith("convaiinnovations/laya")
