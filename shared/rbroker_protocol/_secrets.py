"""The secret detector behind `find_secret`: which rules, in which order, with their sources.

Rules run in the order of `SECRET_RULES`; the first that matches names the rejection. Vendor
formats come first so that `HF_TOKEN=hf_…` is reported as `huggingface_token`, not as a
generic assignment.

Speed and safety on the hot path (every `lease.acquire`): patterns start with a literal or a
character set, not a lookbehind, so the regex engine skips ahead to candidates; most rules
are skipped outright by a substring gate (`needs`); no pattern nests quantifiers over
overlapping classes, and the only unbounded repetitions are single greedy classes, so every
search is linear in the length of the text (no catastrophic backtracking; see the
pathological-input test). Assignments are found by reading back from each `:`/`=` rather
than trying every key at every position.

Sources of the formats:
- AWS: IAM unique id prefixes (AKIA, ASIA, …) and 40-character secret access keys,
  docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html.
- Google Cloud: API keys `AIza` + 35 (cloud.google.com/docs/authentication/api-keys);
  service account key files with `private_key_id` / `private_key`
  (cloud.google.com/iam/docs/keys-create-delete);
  OAuth access tokens `ya29.` and client secrets `GOCSPX-` (developers.google.com/identity).
- Azure Storage: connection strings with `AccountKey=` / `SharedAccessKey=`
  (learn.microsoft.com/azure/storage/common/storage-configure-connection-string) and SAS
  tokens carrying `sig=` (learn.microsoft.com/azure/storage/common/storage-sas-overview).
- GitHub `ghp_ gho_ ghu_ ghs_ ghr_ github_pat_` (github.blog, 2021-04-05, "Behind GitHub's new
  authentication token formats"); GitLab `glpat-` and the other prefixes of
  docs.gitlab.com/ee/security/token_overview.html#token-prefixes.
- Slack `xoxb- xoxp- xoxa- xoxr- xoxs- xoxe- xapp-` and incoming webhooks
  (api.slack.com/authentication/token-types); Discord webhooks (discord.com/developers/docs).
- Stripe `sk_live_ rk_live_ sk_test_ rk_test_ pk_… whsec_` (docs.stripe.com/keys).
- OpenAI `sk-`, `sk-proj-`, `sk-svcacct-`, `sk-admin-` (platform.openai.com/docs/api-reference);
  Anthropic `sk-ant-api03-`, `sk-ant-admin01-` (docs.anthropic.com/en/api).
- Hugging Face `hf_`, `api_org_` (huggingface.co/docs/hub/security-tokens); npm `npm_` + 36
  (github.blog, 2021-09-23, npm's new access token format); PyPI macaroons `pypi-AgE…`
  (pypi.org/help/#apitoken); Replicate `r8_`; Groq `gsk_`; Databricks `dapi` + 32 hex.
- Twilio account and API key SIDs `AC`/`SK` + 32 hex (twilio.com/docs/glossary/what-is-a-sid);
  SendGrid `SG.<22>.<43>` (docs.sendgrid.com, API keys); Telegram bot tokens
  `<bot id>:<35 chars>` (core.telegram.org/bots/api#authorizing-your-bot).
- JWT/JWS/JWE compact serialisation (RFC 7519, RFC 7515 §7.1): base64url of a JSON header,
  which always starts `eyJ` (`{"`).
- PEM private keys (RFC 7468 §10–11), OpenSSH private keys, PGP private key blocks
  (RFC 4880 §6.2), PuTTY key files.
- Credentials in URLs: the userinfo `user:password@` of RFC 3986 §3.2.1.
- E-mail addresses: the common `local@domain.tld` form of RFC 5322 §3.4.1.
- Payment cards and high-entropy strings: see `_cards` and `_entropy`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from rbroker_protocol._cards import find_card
from rbroker_protocol._entropy import find_high_entropy

_A: Final = re.ASCII
_AI: Final = re.ASCII | re.IGNORECASE

_WORD: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_WORD_DASH: Final = _WORD | {"-"}


def _pattern(
    regex: str,
    flags: int = _A,
    glued: frozenset[str] = frozenset(),
    needs: tuple[str, ...] = (),
) -> Callable[[str], int | None]:
    """A rule from one regex: the offset of the first match not glued to a character of
    `glued` on its left (`ghp_…` inside `xghp_…` is not a GitHub token).

    The regex starts with a literal or a character set rather than a lookbehind, so the
    regex engine can skip ahead to candidates; the left edge is checked here instead.
    `needs`: substrings one of which every match contains; without any, the regex is
    skipped (a cheap gate for the hot path).
    """
    compiled = re.compile(regex, flags)

    def search(text: str) -> int | None:
        if needs and not any(n in text for n in needs):
            return None
        match = compiled.search(text)
        while match is not None:
            start = match.start()
            if start == 0 or text[start - 1] not in glued:
                return start
            match = compiled.search(text, start + 1)
        return None

    return search


# --- rules that need a look at what matched --------------------------------------------


_OPENAI: Final = re.compile(r"sk-(?:proj-|svcacct-|admin-|None-)?(?P<body>[A-Za-z0-9_-]{20,})", _A)


def _openai_key(text: str) -> int | None:
    """`sk-…` keys: the body must mix upper case, lower case and digits, as random keys do.

    That keeps hyphenated words such as `sk-learn-pipeline-benchmark-2026` out.
    """
    for match in _OPENAI.finditer(text):
        if match.start() and text[match.start() - 1] in _WORD_DASH:
            continue
        body = match.group("body")
        if "T3BlbkFJ" in body or (
            any(c.isupper() for c in body)
            and any(c.islower() for c in body)
            and any(c.isdigit() for c in body)
        ):
            return match.start()
    return None


_URL_USERINFO: Final = re.compile(r"://[^\s/?#@:]*:[^\s/?#@]+@", _A)
_SCHEME_CHARS: Final = _WORD - {"_"} | {"+", ".", "-"}


def _url_credentials(text: str) -> int | None:
    """`scheme://user:password@host` (also `scheme://:password@host`)."""
    match = _URL_USERINFO.search(text) if "@" in text else None
    if match is None:
        return None
    start = match.start()
    while start > 0 and text[start - 1] in _SCHEME_CHARS:
        start -= 1
    return start


_EMAIL: Final = re.compile(
    r"(?<![A-Za-z0-9._%+-])(?P<local>[A-Za-z0-9._%+-]+)@"
    r"(?P<domain>(?:[A-Za-z0-9-]+\.)+(?P<tld>[A-Za-z]{2,}))(?![A-Za-z0-9-])",
    _A,
)
_FORGE_SSH: Final = frozenset({"github.com", "gitlab.com", "bitbucket.org", "ssh.dev.azure.com"})
_FILE_SUFFIXES: Final = frozenset({
    "pt", "pth", "ckpt", "bin", "safetensors", "onnx", "gguf", "json", "jsonl", "yaml", "yml",
    "toml", "txt", "csv", "tsv", "parquet", "npy", "npz", "h5", "hdf5", "pkl", "py", "ipynb",
    "sh", "md", "png", "jpg", "jpeg", "webp", "wav", "flac", "mp3", "mp4", "mkv", "mov", "tar",
    "gz", "tgz", "zip", "zst", "log",
})  # fmt: skip
"""Names like `model@step.ckpt` and `best@epoch3.pt` are files, not addresses."""


def _email_address(text: str) -> int | None:
    """`local@domain.tld`, except SSH remotes (`git@github.com:org/repo`), `name@file.ext` and
    a user name alone in a URL (`abfss://container@account.dfs.core.windows.net/`)."""
    if "@" not in text:
        return None
    for match in _EMAIL.finditer(text):
        if text.endswith("://", 0, match.start()):
            continue  # URL userinfo without a password: abfss://container@account.dfs…
        domain = match.group("domain").lower()
        if match.group("local") == "git" and domain in _FORGE_SSH:
            continue
        if match.group("tld").lower() in _FILE_SUFFIXES:
            continue
        return match.start()
    return None


_PASSWORD_KEYS: Final = (
    "password", "passwd", "passphrase", "pwd", "passwort", "kennwort", "mot de passe",
    "contraseña", "contrasena", "senha", "parola d'ordine", "parola dordine", "wachtwoord",
    "hasło", "haslo", "пароль", "パスワード", "密码", "密碼", "口令", "비밀번호", "şifre",
    "lösenord",
)  # fmt: skip
_TOKEN_KEYS: Final = (
    "token", "api key", "access key", "secret key", "private key", "auth key", "client key",
    "signing key", "encryption key", "master key", "bearer", "secret", "credentials",
    "credential",
)  # fmt: skip
"""Keys whose value is a credential. A space stands for an optional ` `, `_` or `-`."""


def _reversed_alternation(keys: tuple[str, ...]) -> str:
    """A regex alternation matching each key written backwards, longest first."""
    return "|".join(
        "[ _-]?".join(re.escape(piece[::-1]) for piece in reversed(key.split(" ")))
        for key in sorted(keys, key=len, reverse=True)
    )


_OPERATOR: Final = re.compile(r"[:=]>?|->")
_KEY_BEFORE_OPERATOR: Final = re.compile(
    r"[ \t]*(?:si[ \t]+)?[\"']?(?:(?P<pw>"
    + _reversed_alternation(_PASSWORD_KEYS)
    + r")|(?P<tok>"
    + _reversed_alternation(_TOKEN_KEYS)
    + r"))"
)
"""Matched on the lower-cased text before an operator, reversed: `key`, `"key"`, `key is`
before `:`. Reading backwards from each operator is what keeps this rule fast: operators are
few and the match is anchored, where a forward search would try every key at every
position."""
_KEY_BEFORE_OPERATOR_ANY_CASE: Final = re.compile(_KEY_BEFORE_OPERATOR.pattern, re.IGNORECASE)
"""The same, for the rare text whose lower-case form has another length (`İ`)."""
_VALUE: Final = re.compile(r"[ \t]*(?P<value>[^\s,;]*)")
_KEY_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def _key_prefix(text: str, end: int) -> str:
    """The identifier characters right before `end` (at most 40): `DB_` in `DB_PASSWORD`."""
    start = end
    while start > 0 and end - start < 40 and text[start - 1] in _KEY_CHARS:
        start -= 1
    return text[start:end]


_PLACEHOLDER: Final = re.compile(
    r"""(?:\$\{?\w+\}?|%\w+%|\{\{.*\}\}|<.*>|\[.*\]|\(.*\)|\{.*\}|([*x.?#•_-])\1*|"""
    r"""none|null|nil|true|false|yes|no|n/?a|tbd|todo|unset|empty|redacted|hidden|masked|"""
    r"""omitted|removed|required|optional|env|from[_-]?env|vault|keyring|prompt|ask|auto)""",
    re.IGNORECASE,
)
_WORD_PART: Final = re.compile(r"[A-Za-z][a-z]*|[^\W\d_A-Za-z]+")
_WORD_JOINERS: Final = re.compile(r"[-'’]")


def _plain_words(value: str) -> bool:
    """Plain words (`classified`, `read-only`, `日本語トークナイザ`): prose after a colon, not a
    credential. ASCII parts may only be capitalised; letters of other scripts count as words."""
    return all(_WORD_PART.fullmatch(part) for part in _WORD_JOINERS.split(value))


_NOT_A_SECRET_TOKEN_KEY: Final = re.compile(
    r"(?:^|[_.-])(?:pad|eos|bos|unk|sep|cls|mask|special|max|min|num|n|new|total|start|end|"
    r"stop|image|audio|video|vision|prompt|output|input|sys|system|user|assistant)[_-]?tokens?$",
    re.IGNORECASE,
)


def _password_assignment(text: str) -> int | None:
    """`password=…`, `passwd: …`, `secret=…`, `token: …`, `api_key=…`, `DB_PASSWORD=…` and
    the same words in other languages; not the bare word ("password-reset model").

    The value must be something: placeholders (`***`, `<token>`, `$HF_TOKEN`, `none`,
    `redacted`) pass. Password keys (password, passwd, passphrase, pwd and their
    translations) refuse any value of 3+ characters, since people pick words as passwords;
    `pwd` followed by a path is the working directory. Token, key, secret and credential
    keys refuse values of 8+ characters that are not plain words ("secret: classified"
    passes, "secret: 9fQ2…" does not). Keys that name model vocabulary (`pad_token`,
    `max_new_tokens`) and words glued into others (`ntoken`) are not credentials at all.
    """
    for operator in _OPERATOR.finditer(text):
        at = operator.start()
        before = text[max(0, at - 48) : at][::-1]
        lowered = before.lower()
        if len(lowered) == len(before):
            match = _KEY_BEFORE_OPERATOR.match(lowered)
        else:
            match = _KEY_BEFORE_OPERATOR_ANY_CASE.match(before)
        if match is None:
            continue
        value_match = _VALUE.match(text, operator.end())
        value = value_match.group("value").strip("\"'`") if value_match else ""
        if not value or _PLACEHOLDER.fullmatch(value):
            continue
        start = at - match.end()
        prefix = _key_prefix(text, start)
        if match.group("pw") is not None:
            if match.group("pw") == "dwp" and value[:1] in "/~.\\":
                continue  # the working directory, not a password
            if len(value) >= 3:
                return start - len(prefix)
            continue
        word = text[start : start + len(match.group("tok"))]
        key = prefix + word
        glued = (
            prefix[-1:].isalnum()
            and not (prefix[-1].islower() and word[0].isupper())  # camelCase: accessToken
            and not key.isupper()  # env style: HFTOKEN
        )
        if glued or _NOT_A_SECRET_TOKEN_KEY.search(key):
            continue  # `ntoken=`, `pad_token=`, `max_tokens`: not a credential
        if len(value) >= 8 and not _plain_words(value):
            return start - len(prefix)
    return None


_AUTHORIZATION: Final = re.compile(
    r"(?:(?P<header>(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
    r"(?:(?:basic|bearer|token|digest|bot|apikey|sso-key)[ \t]+)?)|(?P<bearer>bearer[ \t]+))"
    r"(?P<cred>[A-Za-z0-9._~+/=:-]+)",
    re.IGNORECASE,
)


def _authorization(text: str) -> int | None:
    """An HTTP `Authorization:` header value (RFC 9110 §11.6.2) or a bare `Bearer <token>`
    (RFC 6750 §2.1). Header values of 8+ characters that are not plain words are refused;
    after a bare "bearer" the token must have 16+ characters with letters and digits, so
    "bearer of the results" passes.
    """
    lowered = text.lower()
    if "authoriz" not in lowered and "bearer" not in lowered:
        return None
    for match in _AUTHORIZATION.finditer(text):
        cred = match.group("cred")
        if _PLACEHOLDER.fullmatch(cred) or _plain_words(cred):
            continue
        if match.group("header") is not None and len(cred) >= 8:
            return match.start()
        if len(cred) >= 16 and _HAS_DIGIT.search(cred) and _HAS_LETTER.search(cred):
            return match.start()
    return None


_HAS_DIGIT: Final = re.compile(r"[0-9]")
_HAS_LETTER: Final = re.compile(r"[A-Za-z]")


# --- the table -------------------------------------------------------------------------

SECRET_RULES: Final[tuple[tuple[str, Callable[[str], int | None]], ...]] = (
    (
        "private_key_block",
        _pattern(
            r"BEGIN[ \t]+(?:[A-Z0-9]+[ \t]+){0,3}PRIVATE[ \t]+KEY|PuTTY-User-Key-File-[0-9]",
            needs=("BEGIN", "PuTTY"),
        ),
    ),
    (
        "aws_access_key",
        _pattern(
            r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|IPA|NPA|NVA|ROA|PKA|SCA)[A-Z0-9]{16}(?![A-Za-z0-9])",
            glued=_WORD,
        ),
    ),
    (
        "aws_secret_key",
        _pattern(
            r"(?:aws|amazon)[A-Za-z0-9_ .-]{0,20}?secret[A-Za-z0-9_ .-]{0,20}?"
            r"[\"']?[ \t]*(?:[:=]|=>|\bis\b)?[ \t]*[\"']?[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])",
            _AI,
            glued=_WORD - {"_"},
        ),
    ),
    ("google_api_key", _pattern(r"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])", glued=_WORD_DASH)),
    (
        "gcp_service_account_key",
        _pattern(
            r"private_key(?:_id)?[\"']?[ \t]*:[ \t]*[\"'][^\"']{8,}"
            r"|[\"']type[\"'][ \t]*:[ \t]*[\"']service_account[\"']",
            needs=(":",),
        ),
    ),
    (
        "google_oauth_token",
        _pattern(
            r"ya29\.[0-9A-Za-z_-]{20,}|GOCSPX-[0-9A-Za-z_-]{20,}",
            glued=_WORD_DASH,
            needs=("ya29.", "GOCSPX-"),
        ),
    ),
    (
        "azure_storage_key",
        _pattern(
            r"(?:AccountKey|SharedAccessKey|SharedAccessSignature)[ \t]*=[ \t]*[A-Za-z0-9+/%]{16,}",
            _AI,
            needs=("=",),
        ),
    ),
    ("azure_sas_token", _pattern(r"[?&]sig=[A-Za-z0-9%+/]{16,}", _AI, needs=("=",))),
    (
        "github_token",
        _pattern(r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{22,}", glued=_WORD),
    ),
    (
        "gitlab_token",
        _pattern(
            r"gl(?:pat|dt|rt|ptt|cbt|soat|oas|ffct|agent|imt|ft|wt)-[A-Za-z0-9_-]{20,}"
            r"|GR1348941[A-Za-z0-9_-]{20,}",
            glued=_WORD_DASH,
            needs=("gl", "GR1348941"),
        ),
    ),
    (
        "slack_token",
        _pattern(r"xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[0-9]-[A-Za-z0-9-]{10,}", glued=_WORD_DASH),
    ),
    (
        "slack_webhook",
        _pattern(r"hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/]{20,}", _AI),
    ),
    (
        "discord_webhook",
        _pattern(r"discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_-]{20,}", _AI),
    ),
    (
        "stripe_key",
        _pattern(
            r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{24,}",
            glued=_WORD,
            needs=("_live_", "_test_", "whsec_"),
        ),
    ),
    (
        "anthropic_key",
        _pattern(r"sk-ant-(?:[a-z]+[0-9]{2}-)?[A-Za-z0-9_-]{20,}", glued=_WORD_DASH),
    ),
    ("openai_key", _openai_key),
    (
        "huggingface_token",
        _pattern(
            r"hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,}", glued=_WORD, needs=("hf_", "api_org_")
        ),
    ),
    ("npm_token", _pattern(r"npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])", glued=_WORD)),
    ("pypi_token", _pattern(r"pypi-AgE[A-Za-z0-9_-]{40,}", glued=_WORD_DASH)),
    ("replicate_token", _pattern(r"r8_[A-Za-z0-9]{30,}", glued=_WORD)),
    ("groq_key", _pattern(r"gsk_[A-Za-z0-9]{40,}", glued=_WORD)),
    ("databricks_token", _pattern(r"dapi[0-9a-f]{32}(?:-[0-9])?(?![A-Za-z0-9])", glued=_WORD)),
    (
        "twilio_key",
        _pattern(r"(?:AC|SK)[0-9a-f]{32}(?![A-Za-z0-9])", glued=_WORD, needs=("AC", "SK")),
    ),
    ("sendgrid_key", _pattern(r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}", glued=_WORD)),
    (
        "telegram_bot_token",
        _pattern(
            r"[0-9]{8,10}:AA[A-Za-z0-9_-]{33}(?![A-Za-z0-9_-])",
            glued=frozenset("0123456789"),
            needs=(":AA",),
        ),
    ),
    ("jwt", _pattern(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.", glued=_WORD_DASH)),
    ("authorization_header", _authorization),
    ("url_credentials", _url_credentials),
    ("password_assignment", _password_assignment),
    ("email_address", _email_address),
    ("payment_card", find_card),
    ("high_entropy", find_high_entropy),
)
"""(kind, search) in the order they run; `search` returns the offset of a match or None."""


def scan(text: str) -> tuple[str, int] | None:
    """Return (kind, offset) of the first rule that `text` trips, or None."""
    for kind, search in SECRET_RULES:
        offset = search(text)
        if offset is not None:
            return kind, offset
    return None
