//! A span's fields for JSON log lines, written as one JSON object's text when the span opens and
//! added to in place when a field is recorded later.
//!
//! The log layer keeps every open span's fields formatted, so that a line logged inside it can
//! carry them. The stock JSON field format collects a span's fields into a map of JSON values
//! before writing them, and on every later `record` parses the text back, adds the fields and
//! writes it again: at the default `info`, every span of a turn pays that, logged inside or not.
//! [`JsonSpanFields`] (for the stock log layer) and the functions under it (for
//! `json_lines`, which also writes an event's fields with them) write each field straight into
//! the text and append recorded ones before its closing brace. A field recorded twice is written
//! twice; a line's format reads the text as a JSON object, where the later value stands.

use std::cell::RefCell;
use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

/// Span fields as a JSON object's text (see the module header).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct JsonSpanFields;

thread_local! {
    /// Where a span's fields are written before they are handed to the log layer in one piece.
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Past this, a thread's scratch text is let go after use rather than kept.
const SCRATCH_KEPT: usize = 4096;

/// `fields` as one JSON object's text, written into `out`.
fn write_object<R: RecordFields>(out: &mut impl fmt::Write, fields: R) -> fmt::Result {
    out.write_char('{')?;
    write_members(out, fields, true)?;
    out.write_char('}')
}

/// `fields` as one JSON object's text, written into `out` in one piece: into the thread's
/// scratch text first and then handed over whole, so that an empty `String` given as `out` is
/// allocated once at its length, where writing it piece by piece would grow it several times and
/// leave it with room to spare for as long as the span is open.
pub(super) fn write_new_object<R: RecordFields>(
    out: &mut impl fmt::Write,
    fields: R,
) -> fmt::Result {
    let mut fields = Some(fields);
    let handed_over = in_scratch(|text| {
        let fields = fields.take().ok_or(fmt::Error)?;
        write_object(&mut *text, fields).and_then(|()| out.write_str(text))
    });
    match (handed_over, fields) {
        (Some(written), _) => written,
        // No scratch (in use, or the thread's already gone as it exits): written in place.
        (None, Some(fields)) => write_object(out, fields),
        (None, None) => Err(fmt::Error),
    }
}

/// Runs `write` on the thread's scratch text, emptied first; `None` when there is none to use (a
/// field's `Debug` that logs finds it in use, and a thread that exits has let it go).
fn in_scratch(write: impl FnOnce(&mut String) -> fmt::Result) -> Option<fmt::Result> {
    SCRATCH
        .try_with(|scratch| {
            let mut text = scratch.try_borrow_mut().ok()?;
            text.clear();
            let written = write(&mut text);
            if text.capacity() > SCRATCH_KEPT {
                *text = String::new();
            }
            Some(written)
        })
        .ok()
        .flatten()
}

/// Adds `fields` to `text`, an object this module wrote, before its closing brace; text that is
/// not such an object is replaced by one of `fields`. The members are written into the thread's
/// scratch text first and `text` grown by exactly their length: it is kept for as long as its
/// span is open, and grown by doubling it would keep up to as much again unused.
pub(super) fn add_members(text: &mut String, fields: &tracing::span::Record<'_>) -> fmt::Result {
    if text.pop() != Some('}') {
        text.clear();
        return write_new_object(text, fields);
    }
    let first = text.ends_with('{');
    let added = in_scratch(|members| {
        write_members(&mut *members, fields, first)?;
        text.reserve_exact(members.len() + 1);
        text.push_str(members);
        Ok(())
    });
    let written = added.unwrap_or_else(|| write_members(&mut *text, fields, first));
    text.push('}');
    written
}

/// Writes `fields` as members of a JSON object (`"name":value`, commas between), the first
/// without a comma before it when `first`.
pub(super) fn write_members<W: fmt::Write, R: RecordFields>(
    out: &mut W,
    fields: R,
    first: bool,
) -> fmt::Result {
    let mut members = Members {
        out,
        first,
        result: Ok(()),
    };
    fields.record(&mut members);
    members.result
}

impl<'writer> FormatFields<'writer> for JsonSpanFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        write_new_object(&mut writer, fields)
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        add_members(&mut current.fields, fields)
    }
}

/// Writes each field it visits as a member of a JSON object (`"name":value`), commas between.
struct Members<'a, W: fmt::Write> {
    out: &'a mut W,
    /// No member written yet: the next one needs no comma.
    first: bool,
    /// The first write that failed, if any (a visitor cannot return it).
    result: fmt::Result,
}

impl<W: fmt::Write> Members<'_, W> {
    /// Writes `"name":` and then the value through `value`, unless the field is log metadata.
    fn member(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        if name.starts_with("log.") {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.result = (|| {
            if !std::mem::take(&mut self.first) {
                self.out.write_char(',')?;
            }
            write_json_string(self.out, name)?;
            self.out.write_char(':')?;
            value(self.out)
        })();
    }
}

impl<W: fmt::Write> Visit for Members<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.member(field, |out| write_json_string(out, value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity; the stock format writes them as `null` too.
        self.member(field, |out| {
            if value.is_finite() {
                write!(out, "{value}")
            } else {
                out.write_str("null")
            }
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        // An array of numbers, as the stock format writes bytes.
        self.member(field, |out| {
            out.write_char('[')?;
            for (at, byte) in value.iter().enumerate() {
                if at > 0 {
                    out.write_char(',')?;
                }
                write!(out, "{byte}")?;
            }
            out.write_char(']')
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.member(field, |out| {
            out.write_char('"')?;
            write!(Escaped(out), "{value:?}")?;
            out.write_char('"')
        });
    }
}

/// `text` as a JSON string, quoted and escaped.
pub(super) fn write_json_string(out: &mut impl fmt::Write, text: &str) -> fmt::Result {
    out.write_char('"')?;
    Escaped(out).write_str(text)?;
    out.write_char('"')
}

/// Escapes what it is given for the inside of a JSON string.
struct Escaped<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaped<'_, W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut plain = 0;
        for (at, byte) in text.bytes().enumerate() {
            let escape = match byte {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&text[plain..at])?;
            if escape.is_empty() {
                write!(self.0, "\\u{byte:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            plain = at + 1;
        }
        self.0.write_str(&text[plain..])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::Subscriber;
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::{Layer, Registry};

    use super::*;

    /// Keeps a copy of each span's formatted fields when it closes, as `fmt` layers would have
    /// them, formatted by `F`.
    struct Fields<F> {
        format: F,
        kept: Arc<Mutex<Vec<String>>>,
    }

    impl<S, F> Layer<S> for Fields<F>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        F: for<'w> FormatFields<'w> + 'static,
    {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            id: &tracing::Id,
            ctx: Context<'_, S>,
        ) {
            let span = ctx.span(id).expect("the span is open");
            let mut fields = FormattedFields::<F>::new(String::new());
            self.format
                .format_fields(fields.as_writer(), attrs)
                .expect("formatted");
            span.extensions_mut().insert(fields);
        }

        fn on_record(
            &self,
            id: &tracing::Id,
            values: &tracing::span::Record<'_>,
            ctx: Context<'_, S>,
        ) {
            add_recorded(&self.format, id, values, ctx, |_| {});
        }

        fn on_close(&self, id: tracing::Id, ctx: Context<'_, S>) {
            let span = ctx.span(&id).expect("the span is open");
            let extensions = span.extensions();
            let fields = extensions
                .get::<FormattedFields<F>>()
                .expect("formatted when it opened");
            self.kept.lock().expect("kept").push(fields.fields.clone());
        }
    }

    /// Adds fields recorded later to the span's text formatted by `format` (as a `fmt` layer
    /// does), then shows `then` the text.
    fn add_recorded<S, F>(
        format: &F,
        id: &tracing::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
        then: impl FnOnce(&String),
    ) where
        S: Subscriber + for<'a> LookupSpan<'a>,
        F: for<'w> FormatFields<'w> + 'static,
    {
        let span = ctx.span(id).expect("the span is open");
        let mut extensions = span.extensions_mut();
        let fields = extensions
            .get_mut::<FormattedFields<F>>()
            .expect("formatted when it opened");
        format.add_fields(fields, values).expect("added");
        then(&fields.fields);
    }

    /// What each of the spans `make` opens and closes is left with, as JSON, formatted by `F`.
    fn formatted<F>(format: F, make: impl Fn()) -> Vec<serde_json::Value>
    where
        F: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let kept = Arc::new(Mutex::new(Vec::new()));
        let layer = Fields {
            format,
            kept: kept.clone(),
        };
        tracing::subscriber::with_default(Registry::default().with(layer), make);
        let texts = kept.lock().expect("kept").clone();
        texts
            .iter()
            .map(|text| serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}")))
            .collect()
    }

    /// Spans with every kind of value, fields recorded later (into an empty object, onto one
    /// with members, and again), and text that needs escaping.
    fn spans() {
        let odd = "quote \" backslash \\ newline \n tab \t bell \u{7} é ✓";
        let span = tracing::info_span!(
            "process",
            "otel.name" = format!("process {odd}"),
            count = 3_u64,
            delta = -2_i64,
            big = u128::MAX,
            ratio = 0.5_f64,
            nan = f64::NAN,
            yes = true,
            debug = ?Some(odd),
            bytes = &b"ab"[..],
            r#type = ?"kept without its prefix",
            late = tracing::field::Empty,
        );
        span.record("late", "first");
        span.record("late", "second");
        drop(span);
        let empty = tracing::info_span!("empty", later = tracing::field::Empty);
        empty.record("later", 7_i64);
        drop(empty);
        drop(tracing::info_span!("bare"));
    }

    #[test]
    fn the_fields_read_as_the_stock_json_format_writes_them() {
        let ours = formatted(JsonSpanFields, spans);
        let stock = formatted(tracing_subscriber::fmt::format::JsonFields::new(), spans);
        assert_eq!(ours.len(), 3);
        assert_eq!(ours, stock);
        assert_eq!(ours[0]["late"], "second", "the later value stands");
        assert_eq!(ours[0]["type"], "\"kept without its prefix\"");
        assert_eq!(ours[0]["bytes"], serde_json::json!([97, 98]));
        assert_eq!(ours[0]["nan"], serde_json::Value::Null);
        assert_eq!(ours[1], serde_json::json!({ "later": 7 }));
        assert_eq!(ours[2], serde_json::json!({}));
    }

    /// Notes the length and capacity of each new span's text, made as the log layer makes it (an
    /// empty text, written once), and again after each field recorded later.
    struct Capacities(Arc<Mutex<Vec<(usize, usize)>>>);

    impl<S> Layer<S> for Capacities
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            id: &tracing::Id,
            ctx: Context<'_, S>,
        ) {
            let mut fields = FormattedFields::<JsonSpanFields>::new(String::new());
            JsonSpanFields
                .format_fields(fields.as_writer(), attrs)
                .expect("formatted");
            let text = &fields.fields;
            self.0
                .lock()
                .expect("kept")
                .push((text.len(), text.capacity()));
            ctx.span(id)
                .expect("the span is open")
                .extensions_mut()
                .insert(fields);
        }

        fn on_record(
            &self,
            id: &tracing::Id,
            values: &tracing::span::Record<'_>,
            ctx: Context<'_, S>,
        ) {
            add_recorded(&JsonSpanFields, id, values, ctx, |text| {
                self.0
                    .lock()
                    .expect("kept")
                    .push((text.len(), text.capacity()));
            });
        }
    }

    #[test]
    fn a_spans_text_is_allocated_at_its_length_and_grown_by_what_is_recorded() {
        let texts = Arc::new(Mutex::new(Vec::new()));
        let layer = Capacities(texts.clone());
        tracing::subscriber::with_default(Registry::default().with(layer), spans);
        let texts = texts.lock().expect("kept").clone();
        // Three spans opened, three fields recorded later.
        assert_eq!(texts.len(), 6);
        assert!(texts[0].0 > 100, "{texts:?}");
        for (length, capacity) in texts {
            // (The least a `String` allocates is 8 bytes.)
            assert_eq!(capacity, length.max(8), "{length}");
        }
    }

    #[test]
    fn escaped_text_is_every_character_json_needs_escaped() {
        let mut out = String::new();
        write_json_string(&mut out, "a\"b\\c\nd\u{1}e\u{1f}f").expect("written");
        assert_eq!(out, r#""a\"b\\c\nd\u0001e\u001ff""#);
        let parsed: String = serde_json::from_str(&out).expect("a JSON string");
        assert_eq!(parsed, "a\"b\\c\nd\u{1}e\u{1f}f");
    }
}
