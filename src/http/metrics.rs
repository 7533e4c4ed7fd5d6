//! Prometheus metrics. (Being written.)
