package resources

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// MaxInlineContent caps a file spec's inline content: a manifest is a KV
// value, not a file store.
const MaxInlineContent = 64 << 10

// File manages one file: path, mode, optional owner, and its content given
// inline or pinned by sha256. Drift is a change of content, mode or owner.
type File struct{}

// fileSpec is a file resource's typed spec.
type fileSpec struct {
	Path    string
	Mode    fs.FileMode
	Owner   string // "user" or "user:group" (names or numbers); "": leave as is
	Content *string
	SHA256  string // hex; with Content: must match it; alone: the content must already have it
}

func (File) Kind() string { return "file" }

func (f File) Validate(spec Spec) error { _, err := f.spec(spec); return err }

func (File) spec(spec Spec) (fileSpec, error) {
	r := NewSpecReader("file", spec)
	var s fileSpec
	s.Path = r.Str("path", true)
	mode := r.Str("mode", false)
	if _, ok := spec["content"]; ok {
		c := r.Str("content", false)
		s.Content = &c
	} else {
		r.seen["content"] = true
	}
	s.SHA256 = strings.ToLower(r.Str("sha256", false))
	s.Owner = r.Str("owner", false)
	if err := r.Done(); err != nil {
		return s, err
	}
	switch {
	case !filepath.IsAbs(s.Path) || filepath.Clean(s.Path) != s.Path:
		return s, &SpecError{"file", "path", fmt.Sprintf("must be an absolute, clean path (got %s)", s.Path)}
	case s.Content == nil && s.SHA256 == "":
		return s, &SpecError{"file", "content", "give content, or sha256 of the content the file must have"}
	case s.Content != nil && len(*s.Content) > MaxInlineContent:
		return s, &SpecError{"file", "content", fmt.Sprintf("at most %d bytes inline (got %d); pin larger files by sha256", MaxInlineContent, len(*s.Content))}
	}
	if s.SHA256 != "" {
		if b, err := hex.DecodeString(s.SHA256); err != nil || len(b) != sha256.Size {
			return s, &SpecError{"file", "sha256", fmt.Sprintf("must be 64 hex digits (got %s)", s.SHA256)}
		}
		if s.Content != nil && digest([]byte(*s.Content)) != s.SHA256 {
			return s, &SpecError{"file", "sha256", "does not match content"}
		}
	}
	s.Mode = 0o644
	if mode != "" {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m > 0o777 {
			return s, &SpecError{"file", "mode", fmt.Sprintf("must be octal permission bits from 0000 to 0777, such as \"0644\" (got %s)", mode)}
		}
		s.Mode = fs.FileMode(m)
	}
	if s.Owner != "" {
		if _, _, err := lookupOwner(s.Owner); err != nil {
			return s, &SpecError{"file", "owner", err.Error()}
		}
	}
	return s, nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (f File) Observe(_ context.Context, _ string, spec Spec) (Observation, error) {
	s, err := f.spec(spec)
	if err != nil {
		return Observation{}, err
	}
	return f.observe(s)
}

func (File) observe(s fileSpec) (Observation, error) {
	fh, err := os.Open(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return Observation{Drift: "file missing"}, nil
	}
	if err != nil {
		return Observation{}, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return Observation{}, err
	}
	data, err := io.ReadAll(fh)
	if err != nil {
		return Observation{}, err
	}
	sum := digest(data)
	o := Observation{Details: map[string]string{"sha256": sum, "mode": fmt.Sprintf("%04o", st.Mode().Perm()), "size": strconv.Itoa(len(data))}}
	var drift []string
	if (s.Content != nil && !bytes.Equal(data, []byte(*s.Content))) || (s.SHA256 != "" && sum != s.SHA256) {
		drift = append(drift, "content changed")
	}
	if st.Mode().Perm() != s.Mode.Perm() {
		drift = append(drift, fmt.Sprintf("mode %04o, want %04o", st.Mode().Perm(), s.Mode.Perm()))
	}
	if s.Owner != "" {
		uid, gid, _ := lookupOwner(s.Owner)
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && (int(sys.Uid) != uid || (gid >= 0 && int(sys.Gid) != gid)) {
			drift = append(drift, fmt.Sprintf("owner %d:%d, want %s", sys.Uid, sys.Gid, s.Owner))
		}
	}
	o.Drift = strings.Join(drift, "; ")
	o.InSync = o.Drift == ""
	return o, nil
}

func (f File) Reconcile(_ context.Context, _ string, spec Spec) (Observation, error) {
	s, err := f.spec(spec)
	if err != nil {
		return Observation{}, err
	}
	o, err := f.observe(s)
	if err == nil && o.InSync {
		return o, nil
	}
	if s.Content == nil {
		if err != nil {
			return o, err
		}
		return o, fmt.Errorf("%s does not have sha256 %s and the spec has no content to write", s.Path, s.SHA256)
	}
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o755); err != nil {
		return Observation{}, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.Path), "."+filepath.Base(s.Path)+".understudy-*")
	if err != nil {
		return Observation{}, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(*s.Content); err != nil {
		tmp.Close()
		return Observation{}, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return Observation{}, err
	}
	if err := tmp.Close(); err != nil {
		return Observation{}, err
	}
	if err := os.Chmod(tmp.Name(), s.Mode); err != nil {
		return Observation{}, err
	}
	if s.Owner != "" {
		uid, gid, _ := lookupOwner(s.Owner)
		if err := os.Chown(tmp.Name(), uid, gid); err != nil {
			return Observation{}, fmt.Errorf("owner %s: %w", s.Owner, err)
		}
	}
	if err := os.Rename(tmp.Name(), s.Path); err != nil {
		return Observation{}, err
	}
	return f.observe(s)
}

func (f File) Delete(_ context.Context, _ string, spec Spec) error {
	s, err := f.spec(spec)
	if err != nil {
		return err
	}
	if err := os.Remove(s.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// lookupOwner resolves "user[:group]" (names or numbers); gid -1: keep.
func lookupOwner(owner string) (uid, gid int, err error) {
	name, group, hasGroup := strings.Cut(owner, ":")
	uid, err = strconv.Atoi(name)
	if err != nil {
		u, lerr := user.Lookup(name)
		if lerr != nil {
			return 0, 0, fmt.Errorf("no user %s", name)
		}
		uid, _ = strconv.Atoi(u.Uid)
	}
	gid = -1
	if hasGroup {
		gid, err = strconv.Atoi(group)
		if err != nil {
			g, lerr := user.LookupGroup(group)
			if lerr != nil {
				return 0, 0, fmt.Errorf("no group %s", group)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	return uid, gid, nil
}
