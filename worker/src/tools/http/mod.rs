//! The HTTP tools, `http_fetch` (GET; read-only) and `http_request` (GET, HEAD, POST, PUT, PATCH,
//! DELETE with a JSON or text body; destructive), and what they share: the host allowlist, the
//! address guard, redirects, the body cap and the mapping of transport errors.
//!
//! Invariants:
//! - only `http` and `https` URLs, and only hosts matched by the allowlist (`SKEIN_HTTP_ALLOW`:
//!   exact names, `*.suffix` for subdomains of `suffix` — not `suffix` itself —, or `*` for any
//!   host; an empty list allows nothing);
//! - no connection to an address that is not publicly routable (loopback, private, CGNAT,
//!   link-local with the cloud metadata service, unique-local, ... — see [`addresses`]) unless the
//!   allowlist names that IP literally or `SKEIN_HTTP_ALLOW_PRIVATE=true`: IP-literal hosts are
//!   checked here ([`Access::check`], on the URL and on every redirect target), names by the pool's
//!   resolver ([`GuardedResolver`]), which returns only allowed addresses. The connection uses the
//!   addresses that resolver returned, so the check and the use are the same step and a DNS answer
//!   that changes between them (DNS rebinding) cannot get a private address past it. The pool uses
//!   no proxy from the environment: a proxy would resolve the target itself, past the check;
//! - redirects are followed here, by hand, at most [`MAX_REDIRECTS`] times, every hop checked like
//!   the first. GET and HEAD follow 301, 302, 303, 307 and 308 with their own method; other
//!   methods follow only 307 and 308, which keep the method and body by definition, and return a
//!   301, 302 or 303 as output (the model sees its `location`) instead of turning a POST into a
//!   GET behind its back. `Authorization` is dropped when a redirect leads to another origin;
//! - every request, and every hop of it, carries `Idempotency-Key: <the call's key>`: the same on
//!   every run of the call, so a server that honours it applies a retried request once;
//! - the pool is borrowed (held by the tools, shared by every call), never put in a task scope.
//!   Build it with [`client`]: it does not follow redirects itself and resolves through the guard.
//!   A pool built otherwise still has its final URL and its peer address checked, and the body is
//!   withheld when either is refused;
//! - one call, redirects included, is bounded by `http_timeout` (→ [`ToolError::TimedOut`]); a
//!   server that cannot be reached is [`ToolError::Unavailable`] (retryable); a refused host or
//!   address is [`ToolError::Denied`];
//! - a response body is read chunk by chunk and never more than the cap (the smaller of the call's
//!   `max_bytes` and the configured maximum) is kept; a cut body ends with a note.
//!
//! Choice: a non-2xx response is output, not an error. The model gets `HTTP <status>` followed by
//! the body, because a 404 page or an API's error body is what it needs to decide what to do next,
//! and retrying the same request would not change it. Errors are reserved for requests that got no
//! response at all.

pub mod addresses;
mod fetch;
mod request;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, LOCATION};
use reqwest::{Method, StatusCode, Url};
use skein_common::config::ENV_HTTP_ALLOW;

use super::{trim_partial_utf8, ToolError};

pub use addresses::ENV_HTTP_ALLOW_PRIVATE;
pub use addresses::{AddressClass, AddressPolicy, AddressRefused, GuardedResolver};
pub use fetch::{HttpFetch, HttpFetchArgs};
pub use request::{
    HttpMethod, HttpRequest, HttpRequestArgs, MAX_HEADERS, MAX_REQUEST_BODY_BYTES, REFUSED_HEADERS,
};

/// Most redirects one call follows.
pub const MAX_REDIRECTS: usize = 5;

/// The header that carries the call's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Builds an HTTP pool suited to the HTTP tools: no automatic redirects (the tools check each
/// hop), names resolved through a [`GuardedResolver`] with `policy`, no proxy, a connect timeout,
/// and a Skein user agent.
pub fn client(
    connect_timeout: Duration,
    policy: AddressPolicy,
) -> Result<reqwest::Client, reqwest::Error> {
    client_with_resolver(connect_timeout, GuardedResolver::new(policy))
}

/// [`client`] with a given resolver (one wrapping a test's name map, say).
pub fn client_with_resolver(
    connect_timeout: Duration,
    resolver: GuardedResolver,
) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(resolver))
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

/// Settings shared by the HTTP tools.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Host patterns (`SKEIN_HTTP_ALLOW`); IP literals among them also allow that address.
    pub allow: Vec<String>,
    /// Allow every address, private ones included (`SKEIN_HTTP_ALLOW_PRIVATE`).
    pub allow_private: bool,
    /// Most bytes of a response body returned.
    pub max_bytes: usize,
    /// Bound on one call, redirects included.
    pub timeout: Duration,
}

/// What a request of one call sends on every hop.
#[derive(Debug, Clone)]
struct Outgoing {
    method: Method,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
}

impl Outgoing {
    /// A request carrying `idempotency_key` and nothing else yet.
    fn new(method: Method, idempotency_key: &str) -> Result<Self, ToolError> {
        let key = HeaderValue::from_str(idempotency_key).map_err(|_| {
            ToolError::Failed(format!(
                "the call's idempotency key {idempotency_key:?} is not a valid header value"
            ))
        })?;
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, key);
        Ok(Self {
            method,
            headers,
            body: None,
        })
    }
}

/// The pool and the rules one HTTP tool applies.
#[derive(Debug, Clone)]
struct Access {
    client: reqwest::Client,
    allow: Vec<String>,
    policy: AddressPolicy,
    max_bytes: usize,
    timeout: Duration,
}

impl Access {
    fn new(client: reqwest::Client, settings: &HttpSettings) -> Self {
        let allow: Vec<String> = settings
            .allow
            .iter()
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect();
        let policy = AddressPolicy::new(&allow, settings.allow_private);
        Self {
            client,
            allow,
            policy,
            max_bytes: settings.max_bytes,
            timeout: settings.timeout,
        }
    }

    /// Refuses URLs the tools may not request: another scheme, no host, a host the allowlist
    /// does not match, an IP-literal host the address policy refuses.
    fn check(&self, url: &Url) -> Result<(), ToolError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ToolError::Denied(format!(
                "only http and https URLs may be requested, not {}:",
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
        // The URL parser has already folded other spellings (`0x7f.1`, `2130706433`) of an IPv4
        // host into dotted form.
        match normalize_host(host).parse::<std::net::IpAddr>() {
            Ok(ip) => self
                .policy
                .check(ip)
                .map_err(|refused| ToolError::Denied(refused.to_string())),
            Err(_) => Ok(()),
        }
    }

    /// Refuses a response from a peer the address policy refuses (only a pool not built by
    /// [`client`] can connect to one).
    fn check_peer(&self, response: &reqwest::Response) -> Result<(), ToolError> {
        let Some(peer) = response.remote_addr() else {
            return Ok(());
        };
        self.policy.check(peer.ip()).map_err(|refused| {
            let name = response.url().host_str().map(str::to_owned);
            ToolError::Denied(AddressRefused { name, ..refused }.to_string())
        })
    }

    /// The body cap of a call that asked for `requested` bytes.
    fn cap(&self, requested: Option<u64>) -> usize {
        requested.map_or(self.max_bytes, |m| {
            usize::try_from(m).unwrap_or(usize::MAX).min(self.max_bytes)
        })
    }

    /// The allowed hosts and addresses, for a tool description.
    fn reach(&self) -> String {
        if self.allow.is_empty() {
            return "Allowed hosts: none (disabled).".to_owned();
        }
        let hosts = self.allow.join(", ");
        if self.policy.allows_private() {
            format!("Allowed hosts: {hosts}.")
        } else {
            format!(
                "Allowed hosts: {hosts}. Loopback, private and link-local addresses are refused \
                 unless listed."
            )
        }
    }

    /// Runs `work` within the call's bound.
    async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, ToolError>>,
    ) -> Result<T, ToolError> {
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_elapsed| ToolError::TimedOut)?
    }

    /// Sends `outgoing` to `url`, following the redirects its method follows, every hop checked.
    async fn exchange(
        &self,
        mut outgoing: Outgoing,
        mut url: Url,
    ) -> Result<reqwest::Response, ToolError> {
        for _hop in 0..=MAX_REDIRECTS {
            self.check(&url)?;
            let mut request = self
                .client
                .request(outgoing.method.clone(), url.clone())
                .headers(outgoing.headers.clone())
                .timeout(self.timeout);
            if let Some(body) = &outgoing.body {
                request = request.body(body.clone());
            }
            let response = request.send().await.map_err(|e| request_error(&url, &e))?;
            // Only reachable when the pool follows redirects or resolves by itself.
            self.check(response.url())?;
            self.check_peer(&response)?;
            let Some(next) = redirect_target(&outgoing.method, &response) else {
                return Ok(response);
            };
            if next.origin() != url.origin() {
                outgoing.headers.remove(AUTHORIZATION);
            }
            url = next;
        }
        Err(ToolError::Failed(format!(
            "more than {MAX_REDIRECTS} redirects, last to {url}"
        )))
    }
}

/// Where `response` redirects a request of `method` to, when it is followed.
fn redirect_target(method: &Method, response: &reqwest::Response) -> Option<Url> {
    let follows = match response.status() {
        StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT => true,
        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND | StatusCode::SEE_OTHER => {
            *method == Method::GET || *method == Method::HEAD
        }
        _ => false,
    };
    if !follows {
        return None;
    }
    let location = response.headers().get(LOCATION)?.to_str().ok()?;
    response.url().join(location).ok()
}

/// A response body read up to a cap.
#[derive(Debug)]
struct Body {
    bytes: Vec<u8>,
    /// The body went on past the cap.
    truncated: bool,
    /// The length the server declared, if it did.
    declared: Option<u64>,
    cap: usize,
}

impl Body {
    /// The note that ends a cut body.
    fn cut_note(&self) -> Option<String> {
        if !self.truncated {
            return None;
        }
        Some(match self.declared {
            Some(total) => format!("[response truncated at {} of {total} bytes]", self.cap),
            None => format!("[response truncated at {} bytes]", self.cap),
        })
    }
}

/// Reads at most `cap` bytes of the body.
async fn read_body(response: &mut reqwest::Response, cap: usize) -> Result<Body, ToolError> {
    let declared = response.content_length();
    let mut bytes = Vec::with_capacity(cap.min(declared.map_or(8 * 1024, |l| l as usize)));
    let mut truncated = false;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| request_error(response.url(), &e))?
    {
        let room = cap - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    if truncated {
        trim_partial_utf8(&mut bytes);
    }
    Ok(Body {
        bytes,
        truncated,
        declared,
        cap,
    })
}

/// Parses the `url` argument of a call.
fn parse_url(text: &str) -> Result<Url, ToolError> {
    Url::parse(text.trim()).map_err(|e| ToolError::InvalidArguments(format!("url {text:?}: {e}")))
}

/// Maps a transport error to the tool error the model and the dispatcher see.
fn request_error(url: &Url, error: &reqwest::Error) -> ToolError {
    if let Some(refused) = addresses::refusal_in(error) {
        return ToolError::Denied(refused.to_string());
    }
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
