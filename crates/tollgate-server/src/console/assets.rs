//! The console's static files, embedded in the binary, and the headers every console answer
//! carries: a Content-Security-Policy that allows this origin only and no inline script or
//! style, no framing, no referrer, no caching.

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The Content-Security-Policy of console pages and assets: everything from this origin only,
/// no inline script or style (`'unsafe-inline'` is never granted), no plugins, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self'; connect-src 'self'; font-src 'none'; object-src 'none'; \
base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page shell.
pub const INDEX_HTML: &str = include_str!("../../assets/console/index.html");
/// The script: the key in `sessionStorage`, fetches with it, rendering.
pub const CONSOLE_JS: &str = include_str!("../../assets/console/console.js");
/// The stylesheet.
pub const CONSOLE_CSS: &str = include_str!("../../assets/console/console.css");

/// The headers of every console answer (pages, assets and `/v1/console/…` reads).
pub fn security_headers() -> [(HeaderName, HeaderValue); 6] {
    [
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ]
}

/// A static file with its content type and the console's headers.
pub fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        security_headers(),
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attribute `on…=` (an inline event handler).
    fn has_inline_handler(html: &str) -> bool {
        html.match_indices(" on").any(|(at, _)| {
            let rest = &html[at + 3..];
            let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        })
    }

    #[test]
    fn sc_150_assets_have_no_inline_script_or_style_and_no_other_origin() {
        for asset in [INDEX_HTML, CONSOLE_JS, CONSOLE_CSS] {
            assert!(!asset.contains("http://") && !asset.contains("https://"));
            assert!(!asset.contains("style="), "inline style");
            assert!(!asset.contains("innerHTML"), "markup built from strings");
        }
        assert!(!INDEX_HTML.contains("<script>"), "inline script");
        assert!(!INDEX_HTML.contains("<style"), "inline style");
        assert!(!has_inline_handler(INDEX_HTML), "inline handler");
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"));
    }
}
