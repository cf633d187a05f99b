// Package testenv holds small helpers shared by plugd's own tests, so that
// each test package need not keep its own copy.
//
// It is internal and not meant for plugin authors: a public kit for testing
// plugins (plugintest) is planned separately.
package testenv
