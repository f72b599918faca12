//! Real verbs through rdma-core (feature `verbs`): not written yet.
