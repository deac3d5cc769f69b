//! `http_request`: send GET, HEAD, POST, PUT, PATCH or DELETE, with a JSON or text body and a
//! few headers of the caller's, to an allowed host; return the status line, selected response
//! headers and the body.
//!
//! Invariants (beyond those of the parent module):
//! - the request body is at most [`MAX_REQUEST_BODY_BYTES`] ([`ToolError::TooLarge`] otherwise);
//!   `json` and `body` are exclusive, GET and HEAD take neither;
//! - caller headers are checked before anything is sent: at most [`MAX_HEADERS`], valid names and
//!   values (no line breaks), and none of [`REFUSED_HEADERS`] or a `Proxy-*` / `Sec-*` header:
//!   those are the connection's framing and routing (`Host`, `Content-Length`,
//!   `Transfer-Encoding`, `Connection`, ...), the worker's own (`Idempotency-Key`), ambient
//!   credentials (`Cookie`, `Proxy-Authorization`), and `Content-Type`, which comes from
//!   `content_type` so that it always describes the body sent;
//! - `Authorization` is allowed (an API token the model was given for an allowed host) and is not
//!   sent on to another origin when a redirect leads there;
//! - the response is text: the body when it is text (by content type, or valid UTF-8 without NUL
//!   when the type says nothing), otherwise one line describing it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use reqwest::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::{Method, Response};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use skein_common::protocol::ToolEffects;

use super::{parse_url, read_body, Access, Body, HttpSettings, Outgoing, IDEMPOTENCY_KEY};
use crate::tools::{Tool, ToolContext, ToolError};

/// Largest request body `http_request` sends.
pub const MAX_REQUEST_BODY_BYTES: usize = 1024 * 1024;

/// Most caller headers on one request.
pub const MAX_HEADERS: usize = 32;

/// Longest caller header value.
const MAX_HEADER_VALUE_BYTES: usize = 8 * 1024;

/// Caller headers refused by name (lower case); `Proxy-*` and `Sec-*` are refused too.
pub const REFUSED_HEADERS: [&str; 13] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "cookie",
    IDEMPOTENCY_KEY,
    "content-type",
    "via",
];

/// Response headers shown to the model, in this order.
const SHOWN_HEADERS: [&str; 8] = [
    "content-type",
    "content-length",
    "location",
    "retry-after",
    "etag",
    "last-modified",
    "allow",
    "www-authenticate",
];

/// Longest response header value shown.
const MAX_SHOWN_VALUE_CHARS: usize = 512;

/// Sends requests to allowed hosts.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    access: Access,
}

impl HttpRequest {
    /// `client` is the shared pool (built with [`super::client`]).
    pub fn new(client: reqwest::Client, settings: &HttpSettings) -> Self {
        Self {
            access: Access::new(client, settings),
        }
    }
}

/// The methods `http_request` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    #[serde(alias = "get")]
    Get,
    #[serde(alias = "head")]
    Head,
    #[serde(alias = "post")]
    Post,
    #[serde(alias = "put")]
    Put,
    #[serde(alias = "patch")]
    Patch,
    #[serde(alias = "delete")]
    Delete,
}

impl HttpMethod {
    fn method(self) -> Method {
        match self {
            HttpMethod::Get => Method::GET,
            HttpMethod::Head => Method::HEAD,
            HttpMethod::Post => Method::POST,
            HttpMethod::Put => Method::PUT,
            HttpMethod::Patch => Method::PATCH,
            HttpMethod::Delete => Method::DELETE,
        }
    }
}

/// Arguments of `http_request`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpRequestArgs {
    /// HTTP method.
    pub method: HttpMethod,
    /// Absolute http(s) URL.
    pub url: String,
    /// Extra request headers, name to value (`Authorization`, `Accept`, `X-...`). Refused:
    /// Host, Content-Length, Transfer-Encoding, Connection, Cookie, Idempotency-Key (set by the
    /// worker), Content-Type (use `content_type`), Proxy-* and Sec-*.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A JSON body (sent as `application/json` unless `content_type` says otherwise).
    #[serde(default)]
    pub json: Option<Value>,
    /// A text body (sent as `text/plain; charset=utf-8` unless `content_type` says otherwise).
    #[serde(default)]
    pub body: Option<String>,
    /// Content type of the body.
    #[serde(default)]
    pub content_type: Option<String>,
    /// Most bytes of the response body to return (default and ceiling: the worker's limit).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

impl Tool for HttpRequest {
    const NAME: &'static str = "http_request";
    type Args = HttpRequestArgs;

    /// It may change whatever the allowed hosts hold.
    fn effects(&self) -> ToolEffects {
        ToolEffects::DESTRUCTIVE
    }

    fn description(&self) -> String {
        format!(
            "Send an HTTP request (GET, HEAD, POST, PUT, PATCH or DELETE) to an http(s) URL and \
             return the status line, the main response headers and the body as text (at most {} \
             bytes; a binary body is described, not shown). Send a JSON body with `json` or a \
             text body with `body` (at most {MAX_REQUEST_BODY_BYTES} bytes). Every request \
             carries an `Idempotency-Key` header that stays the same when this call is retried. \
             A non-2xx response is returned, not an error. POST, PUT, PATCH and DELETE follow \
             only 307 and 308 redirects; other redirects are returned with their location. {}",
            self.access.max_bytes,
            self.access.reach()
        )
    }

    async fn call(&self, args: HttpRequestArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let url = parse_url(&args.url)?;
        let method = args.method.method();
        let mut outgoing = Outgoing::new(method.clone(), ctx.idempotency_key)?;
        add_caller_headers(&mut outgoing, &args.headers)?;
        add_body(&mut outgoing, &args)?;
        self.access.check(&url)?;
        let cap = self.access.cap(args.max_bytes);
        self.access
            .bounded(async {
                let mut response = self.access.exchange(outgoing, url).await?;
                let body = read_body(&mut response, cap).await?;
                Ok(render(&method, &response, &body))
            })
            .await
    }
}

/// Checks the caller's headers and adds them.
fn add_caller_headers(
    outgoing: &mut Outgoing,
    headers: &BTreeMap<String, String>,
) -> Result<(), ToolError> {
    if headers.len() > MAX_HEADERS {
        return Err(ToolError::InvalidArguments(format!(
            "{} headers given; at most {MAX_HEADERS} may be sent",
            headers.len()
        )));
    }
    for (name, value) in headers {
        let header = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
            ToolError::InvalidArguments(format!("header name {name:?} is not a valid header name"))
        })?;
        if let Some(reason) = refusal(&header) {
            return Err(ToolError::InvalidArguments(format!(
                "header {name:?} may not be set: {reason}"
            )));
        }
        if value.len() > MAX_HEADER_VALUE_BYTES {
            return Err(ToolError::InvalidArguments(format!(
                "header {name:?} is {} bytes long; at most {MAX_HEADER_VALUE_BYTES} are sent",
                value.len()
            )));
        }
        let value = HeaderValue::from_str(value).map_err(|_| {
            ToolError::InvalidArguments(format!(
                "header {name:?} has a value that is not a valid header value (line breaks or \
                 control characters)"
            ))
        })?;
        outgoing.headers.append(header, value);
    }
    Ok(())
}

/// Why a caller may not set `header`, if they may not.
fn refusal(header: &HeaderName) -> Option<&'static str> {
    let name = header.as_str();
    if name == IDEMPOTENCY_KEY {
        Some("the worker sets it to the call's idempotency key")
    } else if name == "content-type" {
        Some("give the body's type with `content_type`")
    } else if REFUSED_HEADERS.contains(&name) {
        Some("it belongs to the connection, not the request")
    } else if name.starts_with("proxy-") {
        Some("proxy headers are not sent")
    } else if name.starts_with("sec-") {
        Some("Sec- headers are reserved to browsers")
    } else {
        None
    }
}

/// Encodes the body and its type.
fn add_body(outgoing: &mut Outgoing, args: &HttpRequestArgs) -> Result<(), ToolError> {
    let (bytes, default_type) = match (&args.json, &args.body) {
        (Some(_), Some(_)) => {
            return Err(ToolError::InvalidArguments(
                "give either `json` or `body`, not both".into(),
            ))
        }
        (Some(json), None) => (json.to_string().into_bytes(), "application/json"),
        (None, Some(text)) => (text.clone().into_bytes(), "text/plain; charset=utf-8"),
        (None, None) => {
            if args.content_type.is_some() {
                return Err(ToolError::InvalidArguments(
                    "`content_type` describes a body: give `json` or `body` too".into(),
                ));
            }
            return Ok(());
        }
    };
    if outgoing.method == Method::GET || outgoing.method == Method::HEAD {
        return Err(ToolError::InvalidArguments(format!(
            "a {} request takes no body; use POST, PUT, PATCH or DELETE",
            outgoing.method
        )));
    }
    if bytes.len() > MAX_REQUEST_BODY_BYTES {
        return Err(ToolError::TooLarge(format!(
            "the request body is {} bytes; at most {MAX_REQUEST_BODY_BYTES} are sent",
            bytes.len()
        )));
    }
    let content_type = args.content_type.as_deref().unwrap_or(default_type);
    let content_type = HeaderValue::from_str(content_type.trim()).map_err(|_| {
        ToolError::InvalidArguments(format!(
            "content_type {content_type:?} is not a valid header value"
        ))
    })?;
    outgoing.headers.insert(CONTENT_TYPE, content_type);
    outgoing.body = Some(bytes);
    Ok(())
}

/// The model's view of a response: status line, shown headers, a blank line, the body.
fn render(method: &Method, response: &Response, body: &Body) -> String {
    let mut out = format!("HTTP {}", response.status());
    for name in SHOWN_HEADERS {
        for value in response.headers().get_all(name) {
            let value = String::from_utf8_lossy(value.as_bytes());
            let shown: String = value.chars().take(MAX_SHOWN_VALUE_CHARS).collect();
            let _ = write!(out, "\n{name}: {shown}");
        }
    }
    out.push_str("\n\n");
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if *method == Method::HEAD {
        out.push_str("(no body: HEAD request)");
    } else if body.bytes.is_empty() {
        out.push_str("(empty body)");
    } else if is_text(content_type, &body.bytes) {
        out.push_str(&String::from_utf8_lossy(&body.bytes));
    } else {
        let size = match (body.truncated, body.declared) {
            (false, _) => format!("{} bytes", body.bytes.len()),
            (true, Some(total)) => format!("{total} bytes"),
            (true, None) => format!("more than {} bytes", body.bytes.len()),
        };
        let kind = if content_type.is_empty() {
            "unknown type".to_owned()
        } else {
            content_type.to_owned()
        };
        let _ = write!(out, "[binary body: {size} of {kind}, not shown]");
        return out;
    }
    if let Some(note) = body.cut_note() {
        out.push('\n');
        out.push_str(&note);
    }
    out
}

/// Whether a body of `content_type` reads as text.
fn is_text(content_type: &str, bytes: &[u8]) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let textual = essence.starts_with("text/")
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
        || matches!(
            essence.as_str(),
            "application/json"
                | "application/xml"
                | "application/javascript"
                | "application/x-www-form-urlencoded"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
                | "application/graphql"
                | "application/x-ndjson"
        );
    if textual {
        return true;
    }
    let unspecific = essence.is_empty() || essence == "application/octet-stream";
    unspecific && !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_told_from_binary() {
        assert!(is_text("application/json; charset=utf-8", b"{}"));
        assert!(is_text("application/problem+json", b"{}"));
        assert!(is_text("TEXT/HTML", &[0xff, 0xfe]));
        assert!(is_text("", "plain é".as_bytes()));
        assert!(!is_text("", &[0x89, b'P', b'N', b'G', 0]));
        assert!(!is_text("image/png", b"looks like text"));
        assert!(!is_text("application/octet-stream", &[0xff, 0x00]));
    }

    #[test]
    fn refused_headers_say_why() {
        let refused = [
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "cookie",
            "idempotency-key",
            "content-type",
            "proxy-authorization",
            "sec-fetch-site",
            "te",
        ];
        for name in refused {
            let header = HeaderName::from_static(name);
            assert!(refusal(&header).is_some(), "{name}");
        }
        for name in ["authorization", "accept", "x-request-id", "user-agent"] {
            let header = HeaderName::from_static(name);
            assert_eq!(refusal(&header), None, "{name}");
        }
    }
}
