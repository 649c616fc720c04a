// Package k8s holds kl's Kubernetes manifests (plain YAML: namespace, service account,
// rules ConfigMap, settings Secret, the node DaemonSet with its metrics Service, and an
// optional RuntimeClass). The Go package exists for its tests, which decode every
// manifest strictly into the k8s.io/api types and check that the pieces fit together;
// nothing imports it.
package k8s
