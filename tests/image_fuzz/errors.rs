//! ERROR events, counted by a tracing layer: the oracle wants none where
//! `check` calls an image clean.

use super::*;

/// ERROR events since the last `take_errors` (the first 50 kept).
pub(crate) static ERRORS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// One test of this binary at a time: ERROR events are counted globally.
pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

pub(crate) struct ErrorLayer;

pub(crate) struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        if field.name() == "message" {
            self.0.push_str(&format!("{value:?}"));
        } else {
            self.0.push_str(&format!("{}={value:?}", field.name()));
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ErrorLayer {
    fn on_event(&self, ev: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *ev.metadata().level() != tracing::Level::ERROR {
            return;
        }
        let mut m = Message(String::new());
        ev.record(&mut m);
        let mut errors = ERRORS.lock().unwrap_or_else(|e| e.into_inner());
        if errors.len() < 50 {
            errors.push(format!("{}: {}", ev.metadata().target(), m.0));
        }
    }
}

pub(crate) fn install_error_layer() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let sub = tracing_subscriber::registry()
            .with(ErrorLayer.with_filter(tracing_subscriber::filter::LevelFilter::ERROR));
        tracing::subscriber::set_global_default(sub).expect("one subscriber");
    });
}

pub(crate) fn take_errors() -> Vec<String> {
    std::mem::take(&mut *ERRORS.lock().unwrap_or_else(|e| e.into_inner()))
}
