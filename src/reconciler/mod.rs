//! The reconciler. (Being written.)
