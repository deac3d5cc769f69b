//! `http_fetch`: GET a URL whose host the operator allowed, through the worker's shared HTTP pool.
//!
//! Invariants:
//! - only `http` and `https` URLs, only GET, and only hosts matched by the allowlist
//!   (`SKEIN_HTTP_ALLOW`: exact names, `*.suffix` for subdomains of `suffix` — not `suffix`
//!   itself —, or `*` for any host; an empty list allows nothing). Every hop of a redirect is
//!   checked the same way: redirects are followed here, by hand, at most [`MAX_REDIRECTS`] times;
//!   build the pool with [`client`] so it does not follow them itself (if it does anyway, the final
//!   URL is still checked and the body withheld when it is not allowed);
//! - the pool is borrowed (held by the tool, shared by every call), never put in a task scope;
//! - one call, redirects included, is bounded by `http_timeout` (→ [`ToolError::TimedOut`]); a
//!   server that cannot be reached is [`ToolError::Unavailable`] (retryable);
//! - the body is read chunk by chunk and never more than the cap (the smaller of the call's
//!   `max_bytes` and the configured maximum) is kept; a cut body ends with a note.
//!
//! Choice: a non-2xx response is output, not an error. The model gets `HTTP <status>` followed by
//! the body, because a 404 page or an API's error body is what it needs to decide what to do next,
//! and retrying the same request would not change it. Errors are reserved for requests that got no
//! response at all.

use std::time::Duration;

use reqwest::{StatusCode, Url};
use schemars::JsonSchema;
use serde::Deserialize;
use skein_common::config::ENV_HTTP_ALLOW;

use super::{trim_partial_utf8, Tool, ToolContext, ToolError};
use skein_common::protocol::ToolEffects;

/// Most redirects one call follows.
pub const MAX_REDIRECTS: usize = 5;

/// Builds an HTTP pool suited to `http_fetch`: no automatic redirects (the tool checks each hop
/// against the allowlist), a connect timeout, and a Skein user agent.
pub fn client(connect_timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(connect_timeout)
        .user_agent(concat!("skein-worker/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Whether `host` is matched by one of the `allow` patterns (exact, `*.suffix`, or `*`),
/// ignoring case, a trailing dot and IPv6 brackets.
pub fn host_allowed(host: &str, allow: &[String]) -> bool {
    let host = normalize_host(host);
    if host.is_empty() {
        return false;
    }
    allow.iter().any(|pattern| {
        if pattern.trim() == "*" {
            return true;
        }
        let pattern = normalize_host(pattern);
        match pattern.strip_prefix("*.") {
            Some(suffix) if !suffix.is_empty() => host
                .strip_suffix(suffix)
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
            Some(_) => false,
            None => !pattern.is_empty() && host == pattern,
        }
    })
}

fn normalize_host(host: &str) -> String {
    let host = host.trim().trim_end_matches('.');
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.to_ascii_lowercase()
}

/// Fetches URLs from allowed hosts.
#[derive(Debug, Clone)]
pub struct HttpFetch {
    client: reqwest::Client,
    allow: Vec<String>,
    max_bytes: usize,
    timeout: Duration,
}

impl HttpFetch {
    /// `allow` holds host patterns; `max_bytes` caps a returned body; `timeout` bounds a call.
    pub fn new(
        client: reqwest::Client,
        allow: Vec<String>,
        max_bytes: usize,
        timeout: Duration,
    ) -> Self {
        let allow = allow
            .into_iter()
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect();
        Self {
            client,
            allow,
            max_bytes,
            timeout,
        }
    }

    /// Refuses URLs this tool may not fetch.
    fn check(&self, url: &Url) -> Result<(), ToolError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ToolError::Denied(format!(
                "only http and https URLs may be fetched, not {}:",
                url.scheme()
            )));
        }
        let host = url.host_str().unwrap_or_default();
        if host.is_empty() {
            return Err(ToolError::InvalidArguments(format!("{url} has no host")));
        }
        if self.allow.is_empty() {
            return Err(ToolError::Denied(format!(
                "host {host} is not allowed: HTTP access is disabled on this worker \
                 ({ENV_HTTP_ALLOW} is empty)"
            )));
        }
        if !host_allowed(host, &self.allow) {
            return Err(ToolError::Denied(format!(
                "host {host} is not allowed by {ENV_HTTP_ALLOW} (allowed: {})",
                self.allow.join(", ")
            )));
        }
        Ok(())
    }

    /// GETs `url`, following allowed redirects, and renders the response.
    async fn fetch(&self, mut url: Url, cap: usize) -> Result<String, ToolError> {
        for _hop in 0..=MAX_REDIRECTS {
            self.check(&url)?;
            let response = self
                .client
                .get(url.clone())
                .timeout(self.timeout)
                .send()
                .await
                .map_err(|e| request_error(&url, &e))?;
            // Only reachable when the pool follows redirects itself.
            self.check(response.url())?;
            if response.status().is_redirection() {
                let next = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| response.url().join(l).ok());
                if let Some(next) = next {
                    url = next;
                    continue;
                }
            }
            return read_response(response, cap).await;
        }
        Err(ToolError::Failed(format!(
            "more than {MAX_REDIRECTS} redirects, last to {url}"
        )))
    }
}

/// Arguments of `http_fetch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpFetchArgs {
    /// Absolute http(s) URL to GET.
    pub url: String,
    /// Most bytes of the body to return (default and ceiling: the worker's limit).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

impl Tool for HttpFetch {
    const NAME: &'static str = "http_fetch";
    type Args = HttpFetchArgs;

    /// GET only: it reads what the allowed hosts serve.
    fn effects(&self) -> ToolEffects {
        ToolEffects {
            read_only: true,
            ..ToolEffects::default()
        }
    }

    fn description(&self) -> String {
        let hosts = if self.allow.is_empty() {
            "none (disabled)".to_owned()
        } else {
            self.allow.join(", ")
        };
        format!(
            "GET an http(s) URL and return its body as text (at most {} bytes). A non-2xx \
             response is returned as `HTTP <status>` followed by the body. Allowed hosts: {hosts}.",
            self.max_bytes
        )
    }

    async fn call(&self, args: HttpFetchArgs, _ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let url = Url::parse(args.url.trim())
            .map_err(|e| ToolError::InvalidArguments(format!("url {:?}: {e}", args.url)))?;
        self.check(&url)?;
        let cap = args.max_bytes.map_or(self.max_bytes, |m| {
            usize::try_from(m).unwrap_or(usize::MAX).min(self.max_bytes)
        });
        tokio::time::timeout(self.timeout, self.fetch(url, cap))
            .await
            .map_err(|_elapsed| ToolError::TimedOut)?
    }
}

/// Reads at most `cap` bytes of the body and renders the response for the model.
async fn read_response(mut response: reqwest::Response, cap: usize) -> Result<String, ToolError> {
    let status = response.status();
    let declared = response.content_length();
    let mut body = Vec::with_capacity(cap.min(declared.map_or(8 * 1024, |l| l as usize)));
    let mut truncated = false;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| request_error(response.url(), &e))?
    {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        body.extend_from_slice(&chunk);
    }
    if truncated {
        trim_partial_utf8(&mut body);
    }
    Ok(render(status, &body, truncated.then_some((cap, declared))))
}

/// The model's view of a response; `cut` is `(cap, declared length)` when the body was cut.
fn render(status: StatusCode, body: &[u8], cut: Option<(usize, Option<u64>)>) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = if status.is_success() {
        if text.is_empty() {
            format!("HTTP {status} (empty body)")
        } else {
            text.into_owned()
        }
    } else {
        format!("HTTP {status}\n\n{text}")
    };
    if let Some((cap, declared)) = cut {
        match declared {
            Some(total) => {
                out.push_str(&format!("\n[response truncated at {cap} of {total} bytes]"))
            }
            None => out.push_str(&format!("\n[response truncated at {cap} bytes]")),
        }
    }
    out
}

/// Maps a transport error to the tool error the model and the dispatcher see.
fn request_error(url: &Url, error: &reqwest::Error) -> ToolError {
    let host = url.host_str().unwrap_or_default();
    let detail = error_chain(error);
    if error.is_timeout() {
        ToolError::TimedOut
    } else if error.is_builder() {
        ToolError::InvalidArguments(format!("cannot request {url}: {detail}"))
    } else if error.is_connect() {
        ToolError::Unavailable(format!("could not connect to {host}: {detail}"))
    } else if error.is_body() || error.is_decode() {
        ToolError::Unavailable(format!(
            "connection to {host} failed while reading the body: {detail}"
        ))
    } else if error.is_redirect() {
        ToolError::Failed(format!("redirect from {url} failed: {detail}"))
    } else {
        ToolError::Unavailable(format!("request to {host} failed: {detail}"))
    }
}

/// `error` and its sources, joined, without the URL reqwest repeats.
fn error_chain(error: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(error);
    while let Some(e) = source {
        parts.push(e.to_string());
        source = e.source();
    }
    if parts.is_empty() {
        error.to_string()
    } else {
        parts.join(": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::{origin, scope, TestDir};
    use crate::tools::ToolRegistry;
    use serde_json::json;

    fn patterns(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exact_hosts_match_ignoring_case_and_trailing_dot() {
        let allow = patterns(&["api.example.com", "[::1]", "10.0.0.1"]);
        assert!(host_allowed("api.example.com", &allow));
        assert!(host_allowed("API.Example.com.", &allow));
        assert!(host_allowed("[::1]", &allow));
        assert!(host_allowed("10.0.0.1", &allow));
        assert!(!host_allowed("example.com", &allow));
        assert!(!host_allowed("evil.api.example.com", &allow));
        assert!(!host_allowed("api.example.com.evil.net", &allow));
    }

    #[test]
    fn suffix_patterns_match_subdomains_only() {
        let allow = patterns(&["*.example.com"]);
        assert!(host_allowed("a.example.com", &allow));
        assert!(host_allowed("a.b.example.com", &allow));
        assert!(!host_allowed("example.com", &allow));
        assert!(!host_allowed("badexample.com", &allow));
        assert!(!host_allowed(".example.com", &allow));
        assert!(!host_allowed("example.com.evil.net", &allow));
    }

    #[test]
    fn star_allows_all_and_empty_allows_none() {
        assert!(host_allowed("anything.test", &patterns(&["*"])));
        assert!(!host_allowed("anything.test", &[]));
        assert!(!host_allowed(
            "anything.test",
            &patterns(&["", "*.", "*x.test"])
        ));
        assert!(!host_allowed("", &patterns(&["*"])));
    }

    #[test]
    fn bodies_render_with_status_and_cut_note() {
        assert_eq!(render(StatusCode::OK, b"hi", None), "hi");
        assert_eq!(
            render(StatusCode::NO_CONTENT, b"", None),
            "HTTP 204 No Content (empty body)"
        );
        assert_eq!(
            render(StatusCode::NOT_FOUND, b"gone", Some((4, Some(10)))),
            "HTTP 404 Not Found\n\ngone\n[response truncated at 4 of 10 bytes]"
        );
    }

    async fn fetch(allow: &[&str], url: &str) -> Result<String, ToolError> {
        let mut registry = ToolRegistry::new();
        registry.register(HttpFetch::new(
            client(Duration::from_secs(1)).expect("client"),
            patterns(allow),
            1024,
            Duration::from_secs(1),
        ));
        let dir = TestDir::new();
        let mut scope = scope(&dir);
        let origin = origin("acme", "s1");
        let ctx = ToolContext {
            origin: &origin,
            call_id: "c1",
            idempotency_key: "key-1",
            scope: &mut scope,
        };
        let result = registry.call("http_fetch", json!({"url": url}), ctx).await;
        scope.close().await.expect("scope closes");
        result
    }

    #[tokio::test]
    async fn refusals_happen_before_any_request() {
        match fetch(&[], "https://example.com/").await {
            Err(ToolError::Denied(m)) => {
                assert!(
                    m.contains("example.com") && m.contains(ENV_HTTP_ALLOW),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        match fetch(&["*.example.com"], "https://example.org/").await {
            Err(ToolError::Denied(m)) => assert!(m.contains("example.org"), "{m}"),
            other => panic!("{other:?}"),
        }
        let file = fetch(&["*"], "file:///etc/passwd").await;
        assert!(matches!(file, Err(ToolError::Denied(_))), "{file:?}");
        let bad = fetch(&["*"], "not a url").await;
        assert!(
            matches!(bad, Err(ToolError::InvalidArguments(_))),
            "{bad:?}"
        );
    }
}
