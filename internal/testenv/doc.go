// Package testenv holds small helpers shared by plugd's own tests, so that
// each test package need not keep its own copy: short socket directories,
// logs a test can wait on, plugins and dead sockets, the binaries that the
// end-to-end suites run as processes (Build), and a fake clock's timers.
//
// It is internal and not meant for plugin authors: theirs is plugintest.
package testenv
