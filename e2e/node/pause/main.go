// pause is the pod sandbox's process for the e2e node: it blocks until SIGTERM or SIGINT and exits 0.
// The node cannot pull registry.k8s.io/pause, so this static binary is imported as the sandbox image.
// With the argument `exit` it exits 0 at once: an init container that finishes.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "exit" {
		return
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
