// Command secrets-store-csi-e2e is the part of a Secrets Store CSI driver deployment that rekindle's
// tests cannot take from a served Go module, in two subcommands:
//
//	registrar  registers the driver with the kubelet (the kubelet's plugin-registration API, what
//	           node-driver-registrar does in a real deployment): it serves GetInfo on a socket in the
//	           kubelet's plugins_registry directory, naming the driver and its CSI socket.
//	provider   a test provider of the driver's provider API (provider/v1alpha1). It is not a secrets
//	           store: a SecretProviderClass's parameter `directory` names a directory under --root, and
//	           every regular file in it is mounted, with the object version the first 16 hex digits of
//	           the SHA-256 of its content. A test rotates a secret by writing the file.
//
// The driver itself is built unchanged from its module (cmd/secrets-store-csi-driver).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

	"google.golang.org/grpc"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	provider "sigs.k8s.io/secrets-store-csi-driver/provider/v1alpha1"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: secrets-store-csi-e2e registrar|provider [flags]")
		os.Exit(2)
	}
	flags := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	var err error
	switch os.Args[1] {
	case "registrar":
		socket := flags.String("socket", "", "the registration socket to serve (in the kubelet's plugins_registry directory)")
		driver := flags.String("driver-name", "secrets-store.csi.k8s.io", "the CSI driver's name")
		endpoint := flags.String("driver-socket", "", "the path of the driver's CSI socket")
		_ = flags.Parse(os.Args[2:])
		err = serve(*socket, func(s *grpc.Server) {
			registration.RegisterRegistrationServer(s, &registrar{name: *driver, endpoint: *endpoint})
		})
	case "provider":
		socket := flags.String("socket", "", "the provider socket (<provider volume>/<provider name>.sock)")
		root := flags.String("root", "", "the directory a SecretProviderClass's `directory` parameter is relative to")
		_ = flags.Parse(os.Args[2:])
		err = serve(*socket, func(s *grpc.Server) {
			provider.RegisterCSIDriverProviderServer(s, &files{root: *root})
		})
	default:
		err = fmt.Errorf("unknown subcommand %q (registrar or provider)", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// serve listens on a unix socket (replacing a stale one) until SIGTERM or SIGINT.
func serve(socket string, register func(*grpc.Server)) error {
	if socket == "" {
		return fmt.Errorf("--socket is required")
	}
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return err
	}
	_ = os.Remove(socket)
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	register(s)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		s.Stop()
	}()
	log.Printf("serving on %s", socket)
	err = s.Serve(lis)
	_ = os.Remove(socket)
	return err
}

type registrar struct {
	name, endpoint string
}

func (r *registrar) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	log.Printf("GetInfo: %s at %s", r.name, r.endpoint)
	return &registration.PluginInfo{
		Type:              registration.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		log.Printf("the kubelet registered %s", r.name)
	} else {
		log.Printf("the kubelet refused %s: %s", r.name, s.Error)
	}
	return &registration.RegistrationStatusResponse{}, nil
}

type files struct {
	provider.UnimplementedCSIDriverProviderServer
	root string
}

func (f *files) Version(context.Context, *provider.VersionRequest) (*provider.VersionResponse, error) {
	return &provider.VersionResponse{Version: "v1alpha1", RuntimeName: "rekindle-e2e", RuntimeVersion: "0.1.0"}, nil
}

func (f *files) Mount(_ context.Context, req *provider.MountRequest) (*provider.MountResponse, error) {
	var attributes map[string]string
	if err := json.Unmarshal([]byte(req.GetAttributes()), &attributes); err != nil {
		return nil, fmt.Errorf("attributes: %w", err)
	}
	dir := attributes["directory"]
	if dir == "" || filepath.IsAbs(dir) || dir != filepath.Clean(dir) || dir == ".." || len(dir) > 2 && dir[:3] == "../" {
		return nil, fmt.Errorf("the SecretProviderClass parameter `directory` must be a relative path under the provider's root, not %q", dir)
	}
	mode := int32(0o644)
	if p := req.GetPermission(); p != "" {
		if m, err := strconv.ParseInt(p, 10, 32); err == nil {
			mode = int32(m)
		}
	}
	entries, err := os.ReadDir(filepath.Join(f.root, dir))
	if err != nil {
		return nil, err
	}
	resp := &provider.MountResponse{}
	var versions []string
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		content, err := os.ReadFile(filepath.Join(f.root, dir, e.Name()))
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(content)
		version := hex.EncodeToString(sum[:])[:16]
		id := dir + "/" + e.Name()
		resp.Files = append(resp.Files, &provider.File{Path: e.Name(), Mode: mode, Contents: content})
		resp.ObjectVersion = append(resp.ObjectVersion, &provider.ObjectVersion{Id: id, Version: version})
		versions = append(versions, id+"="+version)
	}
	sort.Strings(versions)
	log.Printf("mount pod=%s/%s versions=%v", attributes["csi.storage.k8s.io/pod.namespace"], attributes["csi.storage.k8s.io/pod.name"], versions)
	return resp, nil
}
