// pause is the pod sandbox's process for the e2e node: it blocks until SIGTERM or SIGINT and exits 0.
// The node cannot pull registry.k8s.io/pause, so this static binary is imported as the sandbox image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
