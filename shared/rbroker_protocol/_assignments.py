"""Credentials written as assignments: `password=…`, `token: …`, `Authorization: …`.

Both rules look at what follows a key and let obvious non-secrets through: placeholders
(`***`, `<token>`, `$HF_TOKEN`, `none`), plain words after keys that are not passwords
("secret: classified dataset"), model vocabulary (`pad_token=eos_token`, `max_tokens: 512`).
"""

from __future__ import annotations

import re
from typing import Final

_HAS_DIGIT: Final = re.compile(r"[0-9]")
_HAS_LETTER: Final = re.compile(r"[A-Za-z]")

_PASSWORD_KEYS: Final = (
    "password", "pass word", "passwd", "passphrase", "pwd", "pw", "passwort", "kennwort",
    "mot de passe",
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


def find_password_assignment(text: str) -> int | None:
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
            if match.group("pw") == "wp" and prefix[-1:].isalnum():
                continue  # glued into a word: `bpw=4.65` (bits per weight), not a password
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


def find_authorization(text: str) -> int | None:
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


_PASSWORD_WORD: Final = re.compile(
    r"(?<![A-Za-z0-9_-])(?P<flag>--?(?:[a-z0-9]+[_-])*)?"
    r"(?P<key>password|pass[ \t]word|passwd|passphrase|pass|pwd|pw|secret)(?![A-Za-z0-9_])",
)
"""A password key written as a word or a flag (`password`, `pass word`, `passwd`, `pw`,
`--password`, `--db-password`, `--pass`), or `secret` in prose ("my secret is …"), not glued
into another word (`passwordless`, `bypass`, `4.0bpw`) and not the first half of a compound
(`password-reset`: the `-` is checked after the match)."""
_CONNECTOR: Final = re.compile(r"[ \t]*(?:(?:is|was|of|for|to)[ \t]+)?(?:[:=]>?[ \t]*)?")
_NEXT_TOKEN: Final = re.compile(r"[\"'`]?(?P<value>[^\s\"'`,;()]+)")
_PASS_ORDINAL: Final = re.compile(
    r"(?:forward|backward|backwards|first|second|third|final|last|next|one|single|two|three|"
    r"multi|each|every|per|warmup|eval|training|inference|[0-9]+(?:st|nd|rd|th)?)[ \t_-]*$"
)
"""Words before `pass` that make it a pass over data (`forward pass: bf16`), not a password."""
_MYSQL_CLIENT: Final = re.compile(r"\b(?:mysql|mysqldump|mysqladmin|mysqlsh|mariadb)\b")
_GLUED_P: Final = re.compile(r"(?<!\S)-p(?P<value>[^\s\"'`]{2,})")
_SSHPASS: Final = re.compile(r"\bsshpass[ \t]+-p[ \t]*(?P<value>\S{2,})")


def _looks_like_a_password(value: str) -> bool:
    """Not a placeholder, a plain word, a path or a number below 4 digits: `hunter2`,
    `Tr0ub4dor&3`, `123456`. A plain word (`page`, `strength`) is prose, not a password."""
    if len(value) < 4 or _PLACEHOLDER.fullmatch(value) or _plain_words(value):
        return False
    return value[:1] not in "/~.\\-" and "://" not in value


def find_password_argument(text: str) -> int | None:
    """A password given on a command line or in prose rather than as `key=value`:
    `--password hunter2`, `--db-pass Tr0ub4dor&3` (a flag takes any value of 3+
    characters but a placeholder or another flag), `mysql -u root -phunter2` (the MySQL and
    MariaDB clients' glued `-p`), `sshpass -p hunter2`, `passwd hunter2`, `train with my
    password hunter2`, `my password is hunter2`, `db pass: Tr0ub4dor&3`.

    After a bare word (no dashes) the next token must look like a password
    (`_looks_like_a_password`: digits or symbols, 4+ characters), so "reset password page",
    "password strength v2" and "password hashing" pass, as do "passwordless ssh" and
    "password-reset model"; `pass` after a word that makes it a pass over data ("forward
    pass: bf16", "second pass 2x") is not a password. A password that is a plain word in
    prose ("my password swordfish") is not found: prose cannot tell it from a description.
    """
    lowered = text.lower()
    if len(lowered) != len(text):
        lowered = text  # lower-casing changed the length (`İ`): match as written
    if "pass" in lowered or "pw" in lowered or "secret" in lowered:
        for match in _PASSWORD_WORD.finditer(lowered):
            end = match.end()
            if lowered[end : end + 1] in ("-", "_", "."):
                continue  # `password-reset`, `pass_rate`
            key, flag = match.group("key"), match.group("flag")
            before = lowered[max(0, match.start() - 24) : match.start()]
            if key == "pass" and not flag and _PASS_ORDINAL.search(before):
                continue
            connector = _CONNECTOR.match(text, end)
            if connector is None or connector.end() == end:
                continue
            token = _NEXT_TOKEN.match(text, connector.end())
            if token is None:
                continue
            value = token.group("value")
            if key == "secret":
                # only "secret is/was X" with X a made-up string: letters and digits or a
                # symbol, 6+ characters ("the secret is attention", "secret: bf16" pass)
                if (
                    not flag
                    and connector.group(0).strip()[:2] in ("is", "wa")
                    and len(value) >= 6
                    and _looks_like_a_password(value)
                    and _HAS_LETTER.search(value)
                ):
                    return match.start()
                continue
            if flag:
                if len(value) >= 3 and value[:1] != "-" and not _PLACEHOLDER.fullmatch(value):
                    return match.start()
            elif _looks_like_a_password(value):
                return match.start()
    if "-p" in text and _MYSQL_CLIENT.search(lowered):
        for glued in _GLUED_P.finditer(text):
            if not _PLACEHOLDER.fullmatch(glued.group("value")):
                return glued.start()
    if "sshpass" in lowered:
        sshpass = _SSHPASS.search(lowered)
        if sshpass is not None and not _PLACEHOLDER.fullmatch(sshpass.group("value")):
            return sshpass.start()
    return None
