//! A tracing layer the engine benchmarks use to read the engine's own
//! timers: it keeps one numeric field of every debug event that has it.

use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The values of field `name` in events of module `target` seen so far.
#[derive(Clone)]
pub struct FieldLog {
    target: &'static str,
    name: &'static str,
    values: Arc<Mutex<Vec<u64>>>,
}

impl FieldLog {
    /// Installs a log of field `name` of `target`'s events as the global
    /// subscriber.
    pub fn install(
        target: &'static str,
        name: &'static str,
    ) -> Result<FieldLog, tracing::subscriber::SetGlobalDefaultError> {
        let log = FieldLog {
            target,
            name,
            values: Arc::default(),
        };
        let subscriber = tracing_subscriber::registry().with(
            log.clone()
                .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG),
        );
        tracing::subscriber::set_global_default(subscriber)?;
        Ok(log)
    }

    /// Forgets what was seen.
    pub fn clear(&self) {
        self.values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// What was seen since the last `clear` or `take`, which it forgets.
    pub fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.values.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl<S: tracing::Subscriber> Layer<S> for FieldLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Find(&'static str, Option<u64>);
        impl Visit for Find {
            fn record_u64(&mut self, f: &Field, v: u64) {
                if f.name() == self.0 {
                    self.1 = Some(v);
                }
            }
            fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
        }
        if event.metadata().target() != self.target {
            return;
        }
        let mut find = Find(self.name, None);
        event.record(&mut find);
        if let Some(v) = find.1 {
            self.values
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(v);
        }
    }
}
