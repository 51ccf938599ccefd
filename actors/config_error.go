package actors

import "fmt"

// ConfigError reports a configuration value that breaks a rule. It names the
// field (as the user wrote it, e.g. "failover_timeout"), the rule, and the
// offending value, so the message says what to change.
type ConfigError struct {
	Field string
	Rule  string
	Value string
}

func (e *ConfigError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("config: %s: %s", e.Field, e.Rule)
	}
	return fmt.Sprintf("config: %s = %s: %s", e.Field, e.Value, e.Rule)
}
