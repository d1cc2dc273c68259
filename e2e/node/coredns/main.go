// CoreDNS for the real node, with only the plugins its Corefile uses (e2e/scripts/node.sh). The full
// plugin set compiles every cloud provider's SDK and takes twice as long to build; the plugins
// themselves are CoreDNS's own, at the version e2e/scripts/build-binaries.sh pins.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
