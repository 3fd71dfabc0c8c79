// Command mlsched-argocd-health assesses one object's health with Argo CD's own code, the
// way `argocd admin settings resource-overrides health OBJECT --argocd-cm-path CM` does:
// Argo CD's settings manager reads the resource customizations out of the argocd-cm
// ConfigMap, and gitops-engine's health package runs their health.lua in Argo CD's Lua VM.
//
// Why not the argocd CLI itself: it links every Argo CD component (server, repo server,
// controller, their clients), about 2,200 Go packages and 15 minutes of compiling on two
// cores, for one of its subcommands. This program links only the packages that subcommand
// uses. e2e/build_argocd.sh builds it inside Argo CD's module source, so Argo CD's go.mod
// (its replace directives included) picks every dependency's version.
//
//	mlsched-argocd-health version            the Argo CD version it was built from
//	mlsched-argocd-health OBJECT.yaml CM.yaml "STATUS: <status>" and "MESSAGE: <message>"
//
// Exit status 0 with no STATUS line: the ConfigMap has no health check for the object's kind.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/argoproj/gitops-engine/pkg/health"
	log "github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"github.com/argoproj/argo-cd/v3/util/settings"
)

// namespace is where the in-memory ConfigMap and Secret live; any name works, as long as
// the settings manager is told the same one.
const namespace = "argocd"

func main() {
	// The settings manager logs its informers' progress at Info: noise here.
	log.SetLevel(log.WarnLevel)
	switch {
	case len(os.Args) == 2 && os.Args[1] == "version":
		fmt.Println(common.GetVersion().Version)
	case len(os.Args) == 3:
		if err := assess(os.Args[1], os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: mlsched-argocd-health version | OBJECT.yaml ARGOCD-CM.yaml")
		os.Exit(2)
	}
}

func assess(objectPath, configMapPath string) error {
	var object unstructured.Unstructured
	if err := readYAML(objectPath, &object); err != nil {
		return err
	}
	var configMap corev1.ConfigMap
	if err := readYAML(configMapPath, &configMap); err != nil {
		return err
	}
	overrides, err := resourceOverrides(&configMap)
	if err != nil {
		return fmt.Errorf("reading the resource customizations of %s: %w", configMapPath, err)
	}
	result, err := health.GetResourceHealth(&object, lua.ResourceHealthOverrides(overrides))
	if err != nil {
		return err
	}
	if result == nil {
		gvk := object.GroupVersionKind()
		fmt.Printf("Health script is not configured for '%s/%s'\n", gvk.Group, gvk.Kind)
		return nil
	}
	fmt.Printf("STATUS: %s\nMESSAGE: %s\n", result.Status, result.Message)
	return nil
}

// resourceOverrides: what Argo CD's settings manager makes of the ConfigMap, served to it
// from an in-memory clientset with the argocd-secret it also insists on.
func resourceOverrides(configMap *corev1.ConfigMap) (map[string]v1alpha1.ResourceOverride, error) {
	configMap.Name, configMap.Namespace = common.ArgoCDConfigMapName, namespace
	configMap.Labels = map[string]string{"app.kubernetes.io/part-of": "argocd"}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: common.ArgoCDSecretName, Namespace: namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "argocd"},
		},
		Data: map[string][]byte{"server.secretkey": []byte("unused")},
	}
	manager := settings.NewSettingsManager(context.Background(), fake.NewClientset(configMap, secret), namespace)
	if err := manager.ResyncInformers(); err != nil {
		return nil, err
	}
	return manager.GetResourceOverrides()
}

func readYAML(path string, into any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
