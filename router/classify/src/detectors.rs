//! The built-in detectors: one regex each, all compiled into one multi-pattern automaton.
//!
//! Order matters: when two patterns match at the same leftmost position the earlier one wins,
//! so specific shapes (a GitHub token) come before generic ones (`token = ...`, the entropy
//! fallback). If a winner's validator rejects it, the later patterns are tried at that position.
//!
//! Patterns are written with `\b` and `\B`; the classifier turns every word boundary into its
//! ASCII form so the lazy DFA never has to give up on non-ASCII text.

use crate::Sensitivity;

/// What runs on a candidate after the regex matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// The regex alone decides.
    None,
    /// A known-harmless shape (certificates, public keys) consumed so nothing inside it is
    /// mistaken for a secret; never reported.
    Benign,
    /// `"private_key"` must appear near `"type": "service_account"`.
    GcpServiceAccount,
    /// A 40-byte value not followed by more base64.
    AwsSecret,
    /// The value of a `key = value` assignment is not a placeholder, a reference or code.
    Assignment,
    /// A value whose context leaves no doubt it is a credential (URL password, Authorization
    /// header) is not a placeholder.
    SecretValue,
    /// Provider token body is not a placeholder.
    TokenBody,
    /// OpenAI: not Anthropic, mixed classes.
    OpenAi,
    /// Header decodes to JSON with `"alg"`.
    Jwt,
    /// Issuer prefix, length, Luhn.
    CreditCard,
    /// Country length, mod-97.
    Iban,
    /// Area / group / serial rules.
    UsSsn,
    /// Reserved domains, SSH remotes, file names.
    Email,
    /// Digit count by format.
    Phone,
    /// Not part of a longer dotted number.
    PrivateIpv4,
    /// Parses, and is in fc00::/7 or fe80::/10.
    PrivateIpv6,
    /// Not a file name, package or type path.
    InternalHostname,
    /// Entropy, class mix, length cap.
    HighEntropy,
    /// "twilio" or an account SID nearby.
    TwilioToken,
    /// Enough digits to be a document number.
    DocumentNumber,
    /// A single-label host that is not a placeholder (`localhost`, `example`).
    IntranetHost,
    /// A file-share path, not a drive path escaped in JSON (`C:\\Users\\x`).
    UncPath,
}

/// Where a built-in's regex comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source {
    /// A fixed pattern.
    Fixed(&'static str),
    /// Built from the configured internal suffixes.
    InternalHostname,
    /// Built from the configured minimum token length.
    HighEntropy,
}

/// A built-in detector.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Builtin {
    pub id: &'static str,
    pub sensitivity: Sensitivity,
    pub source: Source,
    pub check: Check,
}

const fn fixed(
    id: &'static str,
    sensitivity: Sensitivity,
    pattern: &'static str,
    check: Check,
) -> Builtin {
    Builtin {
        id,
        sensitivity,
        source: Source::Fixed(pattern),
        check,
    }
}

use Sensitivity::{High, Medium};

/// Line break inside a PEM block: a real one (escapes such as JSON's `\n` are already line
/// breaks padded with spaces when the scan runs), after optional trailing blanks.
macro_rules! nl {
    () => {
        r"(?:[ \t]*\r?\n)"
    };
}

/// One IPv4 octet, 0-255.
macro_rules! octet {
    () => {
        r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    };
}

/// What a detector looks for, in a few words: what a reason names instead of the text.
pub(crate) fn description(id: &str) -> &'static str {
    match id {
        "private_key" => "private key",
        "gcp_service_account" => "Google Cloud service account key",
        "azure_storage_key" => "Azure storage account key",
        "azure_client_secret" => "Azure AD client secret",
        "aws_access_key_id" => "AWS access key id",
        "aws_secret_access_key" => "AWS secret access key",
        "authorization_header" => "Authorization header credential",
        "github_token" => "GitHub token",
        "gitlab_token" => "GitLab token",
        "slack_token" => "Slack token",
        "stripe_key" => "Stripe live key",
        "anthropic_key" => "Anthropic API key",
        "openai_key" => "OpenAI API key",
        "huggingface_token" => "Hugging Face token",
        "npm_token" => "npm token",
        "pypi_token" => "PyPI token",
        "google_api_key" => "Google API key",
        "sendgrid_key" => "SendGrid API key",
        "twilio_key" => "Twilio credential",
        "jwt" => "JSON Web Token",
        "credential_url" => "password in a URL",
        "secret_assignment" => "credential assigned to a key",
        "credit_card" => "payment card number",
        "iban" => "IBAN",
        "us_ssn" => "US social security number",
        "passport" => "passport number",
        "national_id" => "national identity number",
        "email" => "email address",
        "phone" => "phone number",
        "private_ipv4" => "private IPv4 address",
        "private_ipv6" => "private IPv6 address",
        "internal_hostname" => "internal host",
        "internal_unc_path" => "internal file share",
        "bare_host_url" => "internal host",
        "high_entropy" => "high-entropy token",
        _ => "operator pattern",
    }
}

/// The built-ins, in priority order. Custom patterns go after these and before
/// [`HIGH_ENTROPY`], which must stay last.
pub(crate) const BUILTINS: &[Builtin] = &[
    fixed(
        "private_key",
        High,
        concat!(
            r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----",
            // Optional armor headers (Proc-Type, DEK-Info, Version), then base64 lines.
            r"(?:",
            nl!(),
            r"(?:[ \t]*[A-Za-z-]+:[^\r\n\\]*",
            nl!(),
            r")*(?:",
            nl!(),
            r")?(?:[ \t]*[A-Za-z0-9+/=]+(?:",
            nl!(),
            r"|\z))*)?",
            r"(?:[ \t]*-----END[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----)?"
        ),
        Check::None,
    ),
    fixed(
        "public_block",
        Sensitivity::Low,
        concat!(
            r"-----BEGIN (?:CERTIFICATE|TRUSTED CERTIFICATE|CERTIFICATE REQUEST|NEW CERTIFICATE REQUEST",
            r"|X509 CRL|PUBLIC KEY|RSA PUBLIC KEY|PGP PUBLIC KEY BLOCK|PGP SIGNATURE|SSH2 PUBLIC KEY)-----",
            r"(?:",
            nl!(),
            r"(?:[ \t]*[A-Za-z-]+:[^\r\n\\]*",
            nl!(),
            r")*(?:",
            nl!(),
            r")?(?:[ \t]*[A-Za-z0-9+/=]+(?:",
            nl!(),
            r"|\z))*)?",
            r"(?:[ \t]*-----END [A-Z0-9 ]{3,30}-----)?"
        ),
        Check::Benign,
    ),
    fixed(
        "ssh_public_key",
        Sensitivity::Low,
        r"\b(?:ssh-(?:rsa|ed25519|dss)|ecdsa-sha2-nistp(?:256|384|521)|sk-(?:ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)[ \t]+AAAA[A-Za-z0-9+/]+={0,3}",
        Check::Benign,
    ),
    fixed(
        "digest",
        Sensitivity::Low,
        // Subresource Integrity hashes (npm lockfiles, Nix), Go module checksums (go.sum), and
        // digests named by their algorithm (`SHA256:` SSH key fingerprints, `sha256:` images).
        concat!(
            r"\b(?:sha(?:1|256|384|512)-[A-Za-z0-9+/]{27,}={0,2}|h1:[A-Za-z0-9+/]{43}=",
            // Each algorithm at its own length, hex or base64: another length is not its
            // digest, so `sha256:` glued to a secret still has the secret judged.
            r"|(?i:md5):(?:[0-9A-Fa-f]{32}\b|[A-Za-z0-9+/]{22}(?:==|\b))",
            r"|(?i:sha1):(?:[0-9A-Fa-f]{40}\b|[A-Za-z0-9+/]{27}(?:=|\b))",
            r"|(?i:sha256):(?:[0-9A-Fa-f]{64}\b|[A-Za-z0-9+/]{43}(?:=|\b))",
            r"|(?i:sha384):(?:[0-9A-Fa-f]{96}\b|[A-Za-z0-9+/]{64}\b)",
            r"|(?i:sha512):(?:[0-9A-Fa-f]{128}\b|[A-Za-z0-9+/]{86}(?:==|\b)))",
            // Hashed host names in known_hosts: `|1|salt|HMAC-SHA1`.
            r"|\|1\|[A-Za-z0-9+/]{27}=\|[A-Za-z0-9+/]{27}="
        ),
        Check::Benign,
    ),
    fixed(
        "api_id",
        Sensitivity::Low,
        // The model APIs' own random ids, in their exact shapes: OpenAI tool-call ids (`call_`
        // and 24 base62) and completion ids (`chatcmpl-`), Anthropic ids (`toolu_01`, `msg_01`,
        // `req_01`, …, also on Bedrock and Vertex). Another length or alphabet is not an id of
        // theirs, so a `call_` glued to a secret is still judged as a secret. The Responses
        // API's ids (`fc_`, `rs_`, `resp_` and hex) never look random enough to need this.
        concat!(
            r"\b(?:call_[A-Za-z0-9]{24}|chatcmpl-[A-Za-z0-9]{20,40}",
            r"|(?:toolu|srvtoolu|msg|msgbatch|req|file)_(?:(?:bdrk|vrtx)_)?01[A-Za-z0-9]{20,26})\b"
        ),
        Check::Benign,
    ),
    fixed(
        "gcp_service_account",
        High,
        r#""type"[ \t]*:[ \t]*"service_account""#,
        Check::GcpServiceAccount,
    ),
    fixed(
        "azure_storage_key",
        High,
        r"\bDefaultEndpointsProtocol=https?;(?:[A-Za-z]+=[^;\s]*;)*?AccountKey=(?P<value>[A-Za-z0-9+/]{40,}={0,2})",
        Check::None,
    ),
    fixed(
        "aws_access_key_id",
        High,
        r"\b(?:AKIA|ASIA)[A-Z2-7]{16}\b",
        Check::None,
    ),
    fixed(
        "aws_secret_access_key",
        High,
        r#"(?i:\b(?:aws[_.-]?)?secret[_.-]?access[_.-]?key|\baws[_.-]?secret[_.-]?key)["']?[ \t]*(?::=|=>|=|:)[ \t]*["']?(?P<value>[A-Za-z0-9/+]{40})"#,
        Check::AwsSecret,
    ),
    fixed(
        "authorization_header",
        High,
        r#"(?i:\bauthorization)["']?[ \t]*[:=][ \t]*["']?(?i:bearer|basic|token|bot)[ \t]+(?P<value>[A-Za-z0-9._~+/=-]{8,})"#,
        Check::SecretValue,
    ),
    fixed(
        "github_token",
        High,
        r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9]{20,}_[A-Za-z0-9]{50,})\b",
        Check::TokenBody,
    ),
    fixed(
        "gitlab_token",
        High,
        r"\bglpat-[A-Za-z0-9_-]{20,}",
        Check::TokenBody,
    ),
    fixed(
        "slack_token",
        High,
        r"\bxox[abprs]-[0-9]{8,}-[A-Za-z0-9-]{8,}",
        Check::TokenBody,
    ),
    fixed(
        "stripe_key",
        High,
        r"\b[rs]k_live_[A-Za-z0-9]{20,}\b",
        Check::TokenBody,
    ),
    fixed(
        "anthropic_key",
        High,
        r"\bsk-ant-[a-z]{3,10}[0-9]{2}-[A-Za-z0-9_-]{32,}",
        Check::TokenBody,
    ),
    fixed(
        "openai_key",
        High,
        r"\bsk-[A-Za-z0-9_-]{32,}",
        Check::OpenAi,
    ),
    fixed(
        "huggingface_token",
        High,
        r"\bhf_[A-Za-z0-9]{30,}\b",
        Check::TokenBody,
    ),
    fixed(
        "npm_token",
        High,
        r"\bnpm_[A-Za-z0-9]{36}\b",
        Check::TokenBody,
    ),
    fixed(
        "pypi_token",
        High,
        // Macaroons whose location caveat is pypi.org or test.pypi.org, base64-encoded.
        r"\bpypi-AgE(?:IcHlwaS5vcmc|NdGVzdC5weXBpLm9yZw)[A-Za-z0-9_-]{50,}",
        Check::None,
    ),
    fixed(
        "google_api_key",
        High,
        r"\bAIza[0-9A-Za-z_-]{35}(?:\b|\z)",
        Check::TokenBody,
    ),
    fixed(
        "sendgrid_key",
        High,
        r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?:\b|\z)",
        Check::TokenBody,
    ),
    fixed(
        "azure_client_secret",
        High,
        // Microsoft Entra (Azure AD) client secrets since 2021: three characters, `8Q~`, 31-34.
        r"\b[A-Za-z0-9_.-]{3}8Q~[A-Za-z0-9_~.-]{31,34}",
        Check::None,
    ),
    fixed(
        "twilio_key",
        High,
        // API key SIDs come with their secret; a bare 32-hex auth token only near Twilio.
        r"\bSK[0-9a-f]{32}\b|\b[0-9a-f]{32}\b",
        Check::TwilioToken,
    ),
    fixed(
        "jwt",
        High,
        r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",
        Check::Jwt,
    ),
    fixed(
        "credential_url",
        High,
        // Ends at '@' so the host is scanned on its own (an internal host is reported too).
        // `:////` is `:\/\/` with its escapes read (PHP escapes slashes in JSON), at any depth.
        r#"\b[A-Za-z][A-Za-z0-9+.-]*:/{2,8}[^\s:/?#@"'<>\[\]]*:(?P<value>[^\s/?#@"'<>]+)@"#,
        Check::SecretValue,
    ),
    fixed(
        "secret_assignment",
        High,
        concat!(
            // The keyword ends the key: `DB_PASSWORD`, `x-api-key`, `clientSecret`; not
            // `max_tokens`. Keys are dotted / dashed / underscored segments, or camelCase.
            r#"(?:(?i:\b(?:[a-z0-9]+[_.-])*[_.-]?(?:pass(?:word|wd|phrase)?|secret|token|api[_-]?key"#,
            r#"|apikey|access[_-]?key|auth[_-]?key|private[_-]?key|client[_-]?secret|credentials?))"#,
            r#"|\b_?[a-z][A-Za-z0-9]*(?:Pass(?:word|wd|phrase)?|Secret|Token|Api[Kk]ey|AccessKey"#,
            r#"|AuthKey|PrivateKey|Credentials?))"#,
            // PHP's `define('DB_PASSWORD', '...')` too: a quoted key, a comma (the validator
            // wants `define(` before it and a quoted value after).
            r#"(?:["']?[ \t]*(?::=|=>|===?|=|:|>)|["'][ \t]*,)[ \t]*"#,
            // A bare value ends at a backtick too: Markdown's code span (`KEY=...`).
            r#"(?P<value>"[^"\r\n]*"|'[^'\r\n]*'|[^\s"',;<>)}\]`]+)"#
        ),
        Check::Assignment,
    ),
    fixed(
        "credit_card",
        High,
        // Every issuer this knows starts with 2-6; the shortest length it accepts is 14.
        r"\b[2-6][0-9]{3}(?:[ -]?[0-9]){10,15}\b",
        Check::CreditCard,
    ),
    fixed(
        "iban",
        High,
        r"\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}\b",
        Check::Iban,
    ),
    fixed(
        "us_ssn",
        High,
        concat!(
            r"\b[0-9]{3}(?:-[0-9]{2}-|[ ][0-9]{2}[ ])[0-9]{4}\b",
            // Nine bare digits only right after the words that name them.
            r"|(?i:\b(?:ssn|social[ ]security(?:[ ]number|[ ]no\.?)?))[ \t]*[:#]?[ \t]*(?:is[ \t]+)?(?P<value>[0-9]{9})\b"
        ),
        Check::UsSsn,
    ),
    fixed(
        "passport",
        High,
        r"(?i:\bpassport)(?:[ \t]+(?i:number|no\.?|num\.?|nr\.?)|[ \t]*#)?[ \t]*[:#]?[ \t]*(?:is[ \t]+)?(?P<value>[A-Z0-9]{6,9})\b",
        Check::DocumentNumber,
    ),
    fixed(
        "national_id",
        High,
        concat!(
            r"(?i:\b(?:national[ _-]?(?:id|identity|identification)(?:[ _-]?(?:number|no\.?|card))?",
            r"|nino|national[ ]insurance(?:[ ]number|[ ]no\.?)?|aadhaar(?:[ ]number|[ ]no\.?)?|bsn",
            r"|personnummer|dni|social[ ]insurance[ ]number))",
            r"[ \t]*[:#]?[ \t]*(?:is[ \t]+)?(?P<value>[A-Z0-9][A-Z0-9 -]{4,18}[A-Z0-9])\b"
        ),
        Check::DocumentNumber,
    ),
    fixed(
        "email",
        High,
        r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}\b",
        Check::Email,
    ),
    fixed(
        "phone",
        High,
        concat!(
            // International: +CC or 00CC, then groups, an optional "(0)" trunk.
            r"(?:\B\+|\b00)[1-9][0-9]{0,3}(?:[ .-]?(?:\(0?[0-9]{1,4}\)[ .-]?)?[0-9]{1,5}){1,6}\b",
            // North American, separators required: (415) 555-0132, 415-555-0132.
            r"|(?:\b1[ .-]?)?(?:\B\([2-9][0-9]{2}\)[ .-]?|\b[2-9][0-9]{2}[ .-])[2-9][0-9]{2}[ .-][0-9]{4}\b",
            // National with a trunk 0: 020 7946 0958, 030 12345678, 01 23 45 67 89.
            r"|\b0[1-9][0-9]{0,3}(?:[ .-]?[0-9]{2,4}){2,4}\b"
        ),
        Check::Phone,
    ),
    fixed(
        "private_ipv4",
        Medium,
        concat!(
            r"\b(?:10\.",
            octet!(),
            r"\.",
            octet!(),
            r"\.",
            octet!(),
            r"|(?:169\.254|192\.168|172\.(?:1[6-9]|2[0-9]|3[01]))\.",
            octet!(),
            r"\.",
            octet!(),
            r")\b"
        ),
        Check::PrivateIpv4,
    ),
    fixed(
        "private_ipv6",
        Medium,
        r"(?i:\b(?:f[cd][0-9a-f]{2}|fe[89ab][0-9a-f])(?::[0-9a-f]{0,4}){2,7})",
        Check::PrivateIpv6,
    ),
    fixed(
        "internal_unc_path",
        Medium,
        // Two backslashes, or four (and so on) when the path is escaped inside JSON.
        r"\\{2,8}[A-Za-z0-9][A-Za-z0-9.-]{0,253}\\{1,4}[A-Za-z0-9$_.-]+",
        Check::UncPath,
    ),
    fixed(
        "bare_host_url",
        Medium,
        r"\b[Hh][Tt][Tt][Pp][Ss]?:/{2,8}(?P<value>[A-Za-z][A-Za-z0-9-]{0,62})(?::[0-9]{1,5})?(?:[/?#]|\s|\z)",
        Check::IntranetHost,
    ),
    Builtin {
        id: "internal_hostname",
        sensitivity: Medium,
        source: Source::InternalHostname,
        check: Check::InternalHostname,
    },
];

/// The entropy fallback; its sensitivity comes from the configuration.
pub(crate) const HIGH_ENTROPY: Builtin = Builtin {
    id: "high_entropy",
    sensitivity: High,
    source: Source::HighEntropy,
    check: Check::HighEntropy,
};

/// The internal-hostname pattern for already-validated suffixes (`corp`, `svc.cluster.local`).
pub(crate) fn internal_hostname_pattern(suffixes: &[String]) -> String {
    let alternatives: Vec<String> = suffixes.iter().map(|s| regex_syntax::escape(s)).collect();
    // An internal label last (`db.corp`) or anywhere after the first (`db.internal.acme.com`);
    // the validator tells names from module paths.
    format!(
        r"(?i:\b[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*\.(?:{})(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*)\b",
        alternatives.join("|")
    )
}

/// The entropy-fallback candidate: a run of base64 / base64url characters at least `min_len`
/// long that contains an upper-case letter, with optional padding.
///
/// The validator wants upper case, lower case and digits; asking the automaton for the upper
/// case letter already keeps hex digests, UUIDs, lower-case paths and identifiers from ever
/// becoming candidates, which is most of what a scan would otherwise reject. A regex cannot
/// intersect "long enough" with "contains", so the pattern spells it out by where the first
/// upper-case letter sits: `k` other characters, the letter, then enough to reach `min_len`.
pub(crate) fn high_entropy_pattern(min_len: usize) -> String {
    const ANY: &str = "[A-Za-z0-9+/_-]";
    const NOT_UPPER: &str = "[a-z0-9+/_-]";
    let mut alternatives = vec![format!("[A-Z]{ANY}{{{},}}", min_len - 1)];
    for k in 1..min_len {
        alternatives.push(format!(
            "[a-z0-9]{NOT_UPPER}{{{}}}[A-Z]{ANY}{{{},}}",
            k - 1,
            min_len - 1 - k
        ));
    }
    alternatives.push(format!(
        "[a-z0-9]{NOT_UPPER}{{{},}}[A-Z]{ANY}*",
        min_len - 1
    ));
    format!(r"\b(?:{})={{0,2}}", alternatives.join("|"))
}
