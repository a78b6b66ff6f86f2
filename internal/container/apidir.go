package container

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// A container run with Config.RankAPI has a directory of its own for the
// rank API (docs/rank-api.md): <data>/containers/NAME/api, root's, 0700,
// bound read-write at rankv1.SocketDir in the container, with
// rankv1.EnvSocket naming the socket there in its environment. The node's
// agent listens on APIDir(NAME)/rank.sock from outside.
//
// What the container sees of the host through it is the directory
// itself, made empty for it alone: the data dir around it stays hidden
// (mask.go), the bind is not recursive and is nosuid, nodev and noexec,
// and the container's /run is its own (opaque) directory, which holds
// nothing but the mount point. What the container writes there is not in
// its overlay, so not in its checkpoints, and stays on the node.
//
// Checkpoints: runc hands CRIU the bind as an external mount, and a
// restore binds the directory of the container it makes (start makes it
// before runc runs: in place, as a copy, on another node). CRIU refuses to
// dump a unix socket connected to a listener outside the container, or
// waiting in its backlog; a socket whose outside peer has closed it is
// dumped as it is. So before a dump the agent removes the socket file and
// closes every connection; after the restore it listens again at the same
// path.

// apiDirName is the API dir's name in the container's dir.
const apiDirName = "api"

// APIDir is the host directory bound at rankv1.SocketDir in container
// name (if it was run with Config.RankAPI): whoever serves the rank API
// listens on filepath.Join(APIDir(name), "rank.sock"). It is made when the
// container starts or is restored, kept across restores in place, and
// removed with the container. The container may write in it: the server
// binds and unlinks its socket by name, and never follows or opens what
// it finds there.
func (m *Manager) APIDir(name string) string { return filepath.Join(m.dir(name), apiDirName) }

// makeAPIDir makes st's API dir, if it has one, 0700 whatever was there.
func (m *Manager) makeAPIDir(st *State) error {
	if !st.Config.RankAPI {
		return nil
	}
	d := m.APIDir(st.Config.Name)
	if err := os.Mkdir(d, 0o700); err != nil && !os.IsExist(err) {
		return fmt.Errorf("rank API dir of %s: %w", st.Config.Name, err)
	}
	if err := os.Chmod(d, 0o700); err != nil {
		return fmt.Errorf("rank API dir of %s: %w", st.Config.Name, err)
	}
	return nil
}

// checkAPIConfig refuses what cannot go with the rank API's dir: a
// volume at, in or over rankv1.SocketDir (it would hide the socket, or
// get the mount point made in a host dir), and a user namespace (the
// dir is root's; ranks never run in one).
func checkAPIConfig(cfg Config) error {
	if !cfg.RankAPI {
		return nil
	}
	if cfg.UserNS {
		return fmt.Errorf("%w: the rank API is for ranks, which do not run in a user namespace of their own", ErrBadConfig)
	}
	for _, v := range cfg.Volumes {
		if v.Path == rankv1.SocketDir || strings.HasPrefix(v.Path, rankv1.SocketDir+"/") || strings.HasPrefix(rankv1.SocketDir, v.Path+"/") {
			return fmt.Errorf("%w: volume %s:%s: %s is the rank API's", ErrBadConfig, v.Host, v.Path, rankv1.SocketDir)
		}
	}
	return nil
}

// apiSpec adds to s what st's config asks of the rank API: the API dir's
// bind and the socket's path in the environment, and, for a command
// started afresh on a files-only checkpoint, that checkpoint's number.
func apiSpec(s *ociSpec, st *State, bundle string) {
	if st.Config.RankAPI {
		s.Mounts = append(s.Mounts, ociMount{rankv1.SocketDir, "none", filepath.Join(bundle, apiDirName),
			[]string{"bind", "rprivate", "nosuid", "nodev", "noexec"}})
		s.Process.Env = setEnv(s.Process.Env, rankv1.EnvSocket, rankv1.SocketPath)
	}
	if st.Restart > 0 {
		s.Process.Env = setEnv(s.Process.Env, rankv1.EnvRestart, strconv.Itoa(st.Restart))
	}
}

// setEnv sets key=val in env, replacing any value the config gave it.
func setEnv(env []string, key, val string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+val)
}
