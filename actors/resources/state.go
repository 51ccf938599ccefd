package resources

import (
	"crypto/rand"
	"os"
	"path/filepath"
)

// randReader names the temporary files the kinds write.
var randReader = rand.Reader

// WriteState replaces a record of the agent's state directory whole
// (mode 0600, its directory 0700): a temporary file, synced, renamed.
// A crash leaves the old record or the new one, and at worst a
// ".understudy-*" file that the next write of the record replaces.
func WriteState(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+filepath.Base(path)+TempPrefix+"state")
	fh, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := fh.Write(b); err != nil {
		fh.Close()
		return err
	}
	if err := fh.Sync(); err != nil {
		fh.Close()
		return err
	}
	if err := fh.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
