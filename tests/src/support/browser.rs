//! A real headless Chromium for the console's tests, driven over W3C WebDriver by the
//! distribution's `chromedriver` (Debian's `chromium` and `chromium-driver` packages, installed by
//! `scripts/ensure-services`): pages opened, elements found, clicked and typed into, keys pressed,
//! scripts run, and the browser's own log of script errors read.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::servers::free_port;
use super::{unique, ChildProcess};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How W3C WebDriver names an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A browser session; the driver (and its browser) stop when it is dropped.
pub struct Browser {
    http: reqwest::Client,
    session: String,
    driver: ChildProcess,
}

/// An element of the page.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session; logs go to `dir`.
    ///
    /// # Panics
    /// When Chromium or its driver is not installed, or the session cannot start.
    pub async fn start(dir: &Path) -> Browser {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(program).exists(),
                "{program} not found: apt-get install chromium chromium-driver (scripts/ensure-services does)"
            );
        }
        let port = free_port();
        let mut command = std::process::Command::new(CHROMEDRIVER);
        command.arg(format!("--port={port}"));
        // Its own process group, so the browsers it starts are stopped with it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let driver = ChildProcess::spawn(
            command,
            dir.join(unique("chromedriver")).with_extension("log"),
        );
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let started = tokio::time::Instant::now();
        loop {
            let ready = http.get(format!("{base}/status")).send().await;
            if let Ok(response) = ready {
                let status: Value = response.json().await.unwrap_or_default();
                if status["value"]["ready"] == true {
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = dir.join(unique("chromium-profile"));
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,900", format!("--user-data-dir={}", profile.display()),
                ],
            },
            "goog:loggingPrefs": { "browser": "ALL" },
        } } });
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("chromedriver answers")
            .json()
            .await
            .expect("a session");
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {created}"))
            .to_owned();
        Browser {
            http,
            session: format!("{base}/session/{session}"),
            driver,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request
            .send()
            .await
            .expect("chromedriver answers")
            .json()
            .await
            .expect("a WebDriver answer");
        answer["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await;
    }

    /// The elements `css` selects now.
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        let found = self
            .post(
                "/elements",
                json!({ "using": "css selector", "value": css }),
            )
            .await;
        found
            .as_array()
            .map(|elements| {
                elements
                    .iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(|id| Element(id.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The first element `css` selects, waiting for it up to 30 s.
    ///
    /// # Panics
    /// When nothing matches by then.
    pub async fn wait_for(&self, css: &str) -> Element {
        let started = tokio::time::Instant::now();
        loop {
            if let Some(element) = self.find_all(css).await.into_iter().next() {
                return element;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "nothing matched {css} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits up to 30 s until `css` selects nothing.
    pub async fn wait_gone(&self, css: &str) {
        let started = tokio::time::Instant::now();
        while !self.find_all(css).await.is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{css} still matched after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The first element `css` selects once its text contains `needle`, waiting up to 30 s.
    ///
    /// # Panics
    /// When no such element shows by then.
    pub async fn wait_for_text(&self, css: &str, needle: &str) -> (Element, String) {
        let started = tokio::time::Instant::now();
        loop {
            for element in self.find_all(css).await {
                let text = self.text(&element).await;
                if text.contains(needle) {
                    return (element, text);
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no {css} said {needle:?} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Opens the console at `console_url` and signs in with `key`; returns once its views show.
    pub async fn sign_in(&self, console_url: &str, key: &str) {
        self.goto(console_url).await;
        let field = self.wait_for("#key").await;
        self.type_into(&field, key).await;
        self.click(&self.wait_for("#sign-in-button").await).await;
        self.wait_for("#views:not([hidden])").await;
    }

    /// Asserts the page met no script error (the console keeps them in `window.consoleErrors`),
    /// the browser logged nothing SEVERE (a failed load, a blocked request), and every resource
    /// the page loaded came from its own origin.
    ///
    /// # Panics
    /// When any of these is not so.
    pub async fn assert_clean(&self) {
        let errors = self
            .execute("return window.consoleErrors;", json!([]))
            .await;
        assert_eq!(errors, json!([]), "script errors");
        assert_eq!(self.severe_logs().await, Vec::<Value>::new());
        let elsewhere = self
            .execute(
                "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith(location.origin));",
                json!([]),
            )
            .await;
        assert_eq!(
            elsewhere,
            json!([]),
            "every request went to the page's origin"
        );
    }

    /// With `SKEIN_UPDATE_SCREENSHOTS` set, writes the page as it shows now to
    /// `docs/console/{name}.png` (the screenshots the README shows).
    pub async fn screenshot_for_docs(&self, name: &str) {
        if std::env::var_os("SKEIN_UPDATE_SCREENSHOTS").is_none() {
            return;
        }
        let png = self.screenshot().await;
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/console")
            .join(format!("{name}.png"));
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("docs/console made");
        std::fs::write(&path, png).expect("screenshot written");
    }

    pub async fn click(&self, element: &Element) {
        self.post(&format!("/element/{}/click", element.0), json!({}))
            .await;
    }

    pub async fn type_into(&self, element: &Element, text: &str) {
        self.post(
            &format!("/element/{}/value", element.0),
            json!({ "text": text }),
        )
        .await;
    }

    pub async fn text(&self, element: &Element) -> String {
        self.call(
            reqwest::Method::GET,
            &format!("/element/{}/text", element.0),
            None,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    /// The page as it shows now, as PNG.
    pub async fn screenshot(&self) -> Vec<u8> {
        let encoded = self.call(reqwest::Method::GET, "/screenshot", None).await;
        decode_base64(encoded.as_str().unwrap_or_default())
    }

    /// A property of the element (`disabled`, `value`, …).
    pub async fn property(&self, element: &Element, name: &str) -> Value {
        self.call(
            reqwest::Method::GET,
            &format!("/element/{}/property/{name}", element.0),
            None,
        )
        .await
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page; its return value.
    pub async fn execute(&self, script: &str, args: Value) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": args }))
            .await
    }

    /// Presses a key (a WebDriver key code such as `\u{E004}`, Tab) on the focused element.
    pub async fn press(&self, key: &str) {
        let actions = json!({ "actions": [ { "type": "key", "id": "keyboard", "actions": [
            { "type": "keyDown", "value": key }, { "type": "keyUp", "value": key }
        ] } ] });
        self.post("/actions", actions).await;
    }

    /// The browser's log entries at `SEVERE` (script errors, failed loads, refused content).
    pub async fn severe_logs(&self) -> Vec<Value> {
        let entries = self.post("/se/log", json!({ "type": "browser" })).await;
        entries
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .filter(|e| e["level"] == "SEVERE")
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Browser {
    /// Stops the driver and every browser process it started (they share its process group).
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status();
    }
}

/// Standard base64 (the screenshot's encoding) decoded; other characters are skipped.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let sextets: Vec<u8> = text.bytes().filter_map(value).collect();
    let mut bytes = Vec::with_capacity(sextets.len() * 3 / 4);
    for chunk in sextets.chunks(4) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |bits, (i, s)| bits | (u32::from(*s) << (18 - 6 * i)));
        let whole = chunk.len() * 6 / 8;
        bytes.extend(bits.to_be_bytes()[1..=whole].iter());
    }
    bytes
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(super::decode_base64("aGVsbG8="), b"hello");
        assert_eq!(super::decode_base64("aGVsbG8h"), b"hello!");
        assert_eq!(super::decode_base64("aGk="), b"hi");
    }
}
