//go:build tools

// The driver's own command, built unchanged from its module: listed here so that `go mod tidy` resolves
// its dependencies.
package main

import _ "sigs.k8s.io/secrets-store-csi-driver/cmd/secrets-store-csi-driver"
