//! Calls from web pages of other origins: the origins allowed (`SKEIN_GATEWAY_CORS_ORIGINS`,
//! `*` for any) get their preflights answered and the CORS headers on every answer; any other
//! origin's preflight is refused (403) and its answers carry no CORS headers, so its browser
//! keeps them from the page. Keys travel as bearer tokens, never cookies, so no credentials mode.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::request::error;

/// Seconds a browser may keep a preflight's answer.
const PREFLIGHT_MAX_AGE: &str = "600";
const METHODS: &str = "GET, POST, OPTIONS";
/// Headers a page may read from an answer besides the simple ones.
const EXPOSED: &str = "retry-after, content-type";

/// The origins allowed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cors {
    origins: Vec<String>,
}

impl Cors {
    pub fn new(origins: &[String]) -> Self {
        Self {
            origins: origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_owned())
                .filter(|o| !o.is_empty())
                .collect(),
        }
    }

    fn allows(&self, origin: &str) -> bool {
        self.origins.iter().any(|o| o == "*" || o == origin)
    }
}

/// The middleware: answers preflights, adds the headers for allowed origins.
pub(crate) async fn cors(State(cors): State<Arc<Cors>>, request: Request, next: Next) -> Response {
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned);
    let Some(origin) = origin else {
        return next.run(request).await;
    };
    let allowed = cors.allows(&origin);
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        if !allowed {
            return error(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                "origin_not_allowed",
                format!(
                    "the origin {origin} may not call this gateway (SKEIN_GATEWAY_CORS_ORIGINS)"
                ),
            )
            .into_response();
        }
        let asked_headers = request
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned();
        let mut response = StatusCode::NO_CONTENT.into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(METHODS),
        );
        if let Some(asked) = asked_headers {
            headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
        }
        headers.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE),
        );
        allow(&mut response, &origin);
        return response;
    }
    let mut response = next.run(request).await;
    if allowed {
        allow(&mut response, &origin);
        response.headers_mut().insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED),
        );
    }
    response
}

fn allow(response: &mut Response, origin: &str) {
    if let Ok(value) = HeaderValue::from_str(origin) {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.append(header::VARY, HeaderValue::from_static("origin"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_origins_are_allowed() {
        let cors = Cors::new(&["https://console.example.com/".into(), " ".into()]);
        assert!(cors.allows("https://console.example.com"));
        assert!(!cors.allows("https://evil.example.com"));
        assert!(!cors.allows(""));
        assert!(Cors::new(&["*".into()]).allows("https://any.example"));
        assert!(!Cors::default().allows("https://console.example.com"));
    }
}
