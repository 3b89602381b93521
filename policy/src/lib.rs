//! Network policy, sans-IO: the policy resources users write (Kubernetes and Calico), label
//! selectors, and what each workload endpoint must enforce. No I/O, no runtime, no kernel:
//! bgpd feeds it the cluster's resources, routewriter enforces what it computes.
