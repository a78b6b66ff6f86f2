package container_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestRecordedConfigRules: what a crafted record's config could ask for
// that Run never grants is refused by the rules import and receive apply.
func TestRecordedConfigRules(t *testing.T) {
	bad := map[string]string{
		"the host's root as a volume": `{"volumes":[{"host":"/","path":"/host"}]}`,
		"host /proc":                  `{"volumes":[{"host":"/proc","path":"/p"}]}`,
		"below host /sys":             `{"volumes":[{"host":"/sys/fs/cgroup","path":"/c"}]}`,
		"host /dev":                   `{"volumes":[{"host":"/dev","path":"/d"}]}`,
		"a relative host path":        `{"volumes":[{"host":"etc","path":"/e"}]}`,
		"an unclean host path":        `{"volumes":[{"host":"/tmp/../etc","path":"/e"}]}`,
		"over the tools":              `{"volumes":[{"host":"/tmp","path":"/.cairn"}]}`,
		"a root from /proc":           `{"rootfs":"/proc/1/root"}`,
		"a relative root":             `{"rootfs":"x"}`,
		"a negative memory":           `{"memory":-1}`,
		"not JSON":                    `{"volumes":`,
	}
	for what, raw := range bad {
		if err := container.CheckRecordedConfig(json.RawMessage(raw)); err == nil {
			t.Errorf("%s (%s): accepted", what, raw)
		}
	}
	for _, raw := range []string{``, `{}`, `{"volumes":[{"host":"/srv/data","path":"/data","ro":true}],"tools":"/var/lib/x","net":{"netns":"/proc/self/ns/net"}}`} {
		if err := container.CheckRecordedConfig(json.RawMessage(raw)); err != nil {
			t.Errorf("%s: %v", raw, err)
		}
	}
}

// rewriteConfig edits the config recorded in checkpoint name:seq as a
// hostile file or a record stored before import checked it would have it.
func rewriteConfig(t *testing.T, env *testutil.Env, name string, seq int, edit func(cfg map[string]any)) {
	t.Helper()
	path := filepath.Join(env.Manager.Repo().Dir, name, fmt.Sprint(seq)+".json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	cfg := rec["config"].(map[string]any)
	edit(cfg)
	if b, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreTakesNoGrantsFromTheRecord: a checkpoint whose recorded
// config asks for the host's root as a volume, the host's root as the
// tools dir, or the host's network namespace, restores with none of
// them: the volume refuses the restore as corrupt before anything runs,
// the tools dir refuses it unless the caller gives its own (which is
// mounted instead, as far as the image had one), and the network is the
// container's own.
func TestRestoreTakesNoGrantsFromTheRecord(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	if _, err := m.Run(ctx, container.Config{Name: "app", Args: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Checkpoint(ctx, "app", container.CheckpointOptions{Stop: true}); err != nil {
		t.Fatal(err)
	}

	rewriteConfig(t, env, "app", 1, func(cfg map[string]any) {
		cfg["volumes"] = []map[string]any{{"host": "/", "path": "/host"}}
	})
	_, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: 1})
	if !errors.Is(err, image.ErrCorrupt) || errors.Is(err, container.ErrBadConfig) {
		t.Fatalf("restore with the host's root as a recorded volume: %v, want ErrCorrupt (exit 4)", err)
	}
	if in, err := m.Get(ctx, "app"); err == nil && in.Status.Live() {
		t.Fatalf("the container runs after a refused restore: %s", in.Status)
	}

	rewriteConfig(t, env, "app", 1, func(cfg map[string]any) {
		delete(cfg, "volumes")
		cfg["tools"] = "/"
	})
	if _, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: 1}); !errors.Is(err, container.ErrBadConfig) {
		t.Fatalf("restore with the host's root as the recorded tools dir and none given: %v, want ErrBadConfig", err)
	}
	tools := t.TempDir()
	rewriteConfig(t, env, "app", 1, func(cfg map[string]any) {
		cfg["net"] = map[string]any{"netns": "/proc/self/ns/net", "addr": "10.9.9.9"}
	})
	if _, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: 1, Tools: tools}); err != nil {
		t.Fatal(err)
	}
	out := execOut(t, m, "app", "ls -A /.cairn 2>/dev/null; echo NET $(readlink /proc/self/ns/net)")
	hostNet, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "etc") || strings.Contains(out, "NET "+hostNet) || !strings.Contains(out, "NET net:") {
		t.Fatalf("the restored container sees:\n%s\nwant neither the host's root at /.cairn nor its network (%s)", out, hostNet)
	}
	t.Logf("restored: %s", strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
}

// FuzzRecordedConfig: whatever a record's config holds, CheckRecordedConfig
// does not panic, and a config it accepts mounts nothing of the host's
// root, /proc, /sys or /dev, however its paths are spelt.
func FuzzRecordedConfig(f *testing.F) {
	for _, s := range []string{`{}`, `{"volumes":[{"host":"/","path":"/host"}]}`, `{"volumes":[{"host":"/proc/../","path":"/p"}]}`,
		`{"rootfs":"/sys"}`, `{"volumes":[{"host":"/srv","path":"/data"}],"tools":"/"}`, `{"volumes":[{"host":"//dev","path":"/d"}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if container.CheckRecordedConfig(raw) != nil {
			return
		}
		var cfg container.Config
		if json.Unmarshal(raw, &cfg) != nil {
			return // empty: grants nothing
		}
		hostOnly := func(p string) bool {
			p = filepath.Clean("/" + p)
			for _, d := range []string{"/proc", "/sys", "/dev"} {
				if p == d || strings.HasPrefix(p, d+"/") {
					return true
				}
			}
			return false
		}
		for _, v := range cfg.Volumes {
			if filepath.Clean("/"+v.Host) == "/" || hostOnly(v.Host) {
				t.Fatalf("accepted a volume of host %q", v.Host)
			}
		}
		if cfg.RootFS != "" && hostOnly(cfg.RootFS) {
			t.Fatalf("accepted a root from %q", cfg.RootFS)
		}
	})
}
