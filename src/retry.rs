//! The one retry policy: exponential backoff with jitter, so replicas and workloads retrying the same
//! failure do not retry in step. Callers decide what is retryable; deterministic failures never are.

use std::time::Duration;

use backon::ExponentialBuilder;

/// Backoff from `first`, doubling up to `max`, for at most `retries` retries after the first attempt.
pub fn backoff(first: Duration, max: Duration, retries: usize) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_max_times(retries)
        .with_jitter()
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::BackoffBuilder;

    #[test]
    fn bounded_by_retries_and_max_delay() {
        let delays: Vec<Duration> = backoff(Duration::from_millis(100), Duration::from_secs(1), 6)
            .build()
            .collect();
        assert_eq!(delays.len(), 6);
        // Jitter adds up to one delay on top of each step.
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(2)),
            "{delays:?}"
        );
        assert!(delays[0] >= Duration::from_millis(100));
    }
}
