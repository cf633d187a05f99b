// Package deploy holds plugd's packaging; its tests check the manifests.
package deploy
