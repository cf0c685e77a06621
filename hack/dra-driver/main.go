// Command gpuplace-dra-driver is a fake GPU DRA driver for the local cluster's real node: a
// kubelet plugin built from k8s.io/dynamic-resource-allocation/kubeletplugin that publishes, as
// the node's ResourceSlice, the GPUs of the node's fake NVML configuration (the JSON file the fake
// libnvidia-ml.so.1 reads: uuid, productName, memory) and the MIG instances of GPUs in MIG mode
// (`migInstances`), named and described as NVIDIA's driver does: whole GPUs `gpu-<index>` with
// `type: gpu`; MIG instances `gpu-<index>-mig-<profile>-<start>` (a device name is a DNS label,
// so the profile's `.` and `+` become `-`) with `type: mig`, `uuid`, `parentUUID` and `profile`.
// Devices carry the taints of the optional --taints file, a JSON object from device UUID (GPU or
// MIG) to a list of {"key", "value", "effect"} (the fake NVML library refuses keys it does not
// know, so taints cannot live in its file).
// It prepares a claim by writing a CDI spec whose container edits name exactly the claim's
// allocated devices (a MIG instance by its MIG UUID, as the real driver's CDI does):
//
//	NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>   GPU_DEVICE_<n>=<device name>=<uuid>   DRA_CLAIM=<ns>/<name>
//
// No GPU is touched: what the container sees is the environment the CDI spec gives it, which is
// what a test reads to prove that the kubelet prepared exactly the allocation.
//
//	gpuplace-dra-driver --kubeconfig=K --node=N --nvml-config=F [--taints=T] --cdi-dir=D \
//	    --registrar-dir=<kubelet>/plugins_registry --plugin-dir=<kubelet>/plugins/gpu.nvidia.com
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

type migInstance struct {
	UUID      string `json:"uuid"`
	Profile   string `json:"profile"`
	Placement struct {
		Start int `json:"start"`
	} `json:"placement"`
	MemoryMiB int64 `json:"memoryMiB"`
}

type nvmlDevice struct {
	Index          int           `json:"index"`
	UUID           string        `json:"uuid"`
	Name           string        `json:"name"`
	MemoryTotalMiB int64         `json:"memoryTotalMiB"`
	MigMode        *bool         `json:"migMode"`
	MigInstances   []migInstance `json:"migInstances"`
}

type nvmlConfig struct {
	Devices []nvmlDevice `json:"devices"`
}

type taint struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Effect string `json:"effect"`
}

// deviceName is how the driver names an NVML device in its pool (gpuplace matches by UUID).
func deviceName(index int) string { return fmt.Sprintf("gpu-%d", index) }

// migDeviceName names a MIG instance; a device name is a DNS label, so "3g.40gb" becomes "3g-40gb".
func migDeviceName(index int, profile string, start int) string {
	label := strings.NewReplacer(".", "-", "+", "-").Replace(strings.ToLower(profile))
	return fmt.Sprintf("gpu-%d-mig-%s-%d", index, label, start)
}

// migEnabled: MIG instances are published only from a GPU whose current MIG mode is on.
func migEnabled(dev nvmlDevice) bool { return dev.MigMode != nil && *dev.MigMode }

type driver struct {
	name    string
	cdiDir  string
	cdiKind string            // <vendor>/<class> of the CDI devices this driver writes
	byName  map[string]string // device name -> the UUID the container is given
	mu      sync.Mutex
}

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("gpuplace-dra-%s.json", uid))
}

// PrepareResourceClaims writes one CDI spec per claim, with one CDI device whose edits name the
// claim's devices of this driver, and returns that device for every allocated device.
func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		out[claim.UID] = d.prepare(claim)
	}
	return out, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	var results []resourceapi.DeviceRequestAllocationResult
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == d.name {
			results = append(results, r)
		}
	}
	sort.Slice(results, func(i, j int) bool { return results[i].Device < results[j].Device })
	uuids := make([]string, 0, len(results))
	env := []string{fmt.Sprintf("DRA_CLAIM=%s/%s", claim.Namespace, claim.Name)}
	for i, r := range results {
		uuid, ok := d.byName[r.Device]
		if !ok {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("device %s/%s is not on this node", r.Pool, r.Device)}
		}
		uuids = append(uuids, uuid)
		env = append(env, fmt.Sprintf("GPU_DEVICE_%d=%s=%s", i, r.Device, uuid))
	}
	env = append(env, "NVIDIA_VISIBLE_DEVICES="+strings.Join(uuids, ","))
	cdiName := string(claim.UID)
	spec := map[string]any{
		"cdiVersion": "0.6.0",
		"kind":       d.cdiKind,
		"devices": []any{map[string]any{
			"name":           cdiName,
			"containerEdits": map[string]any{"env": env},
		}},
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err == nil {
		err = writeAtomically(d.specPath(claim.UID), data)
	}
	if err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("CDI spec for claim %s/%s: %w", claim.Namespace, claim.Name, err)}
	}
	id := d.cdiKind + "=" + cdiName
	devices := make([]kubeletplugin.Device, 0, len(results))
	for _, r := range results {
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			CDIDeviceIDs: []string{id},
		})
	}
	return kubeletplugin.PrepareResult{Devices: devices}
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.Remove(d.specPath(claim.UID))
		if os.IsNotExist(err) {
			err = nil
		}
		out[claim.UID] = err
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func writeAtomically(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func deviceTaints(taints map[string][]taint, uuid string) []resourceapi.DeviceTaint {
	var out []resourceapi.DeviceTaint
	for _, t := range taints[uuid] {
		out = append(out, resourceapi.DeviceTaint{
			Key:    t.Key,
			Value:  t.Value,
			Effect: resourceapi.DeviceTaintEffect(t.Effect),
		})
	}
	return out
}

func memory(mib int64) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		"memory": {Value: *resource.NewQuantity(mib*1024*1024, resource.BinarySI)},
	}
}

func slices(config nvmlConfig, taints map[string][]taint) []resourceapi.Device {
	devices := make([]resourceapi.Device, 0, len(config.Devices))
	for _, dev := range config.Devices {
		devices = append(devices, resourceapi.Device{
			Name: deviceName(dev.Index),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":        {StringValue: ptr.To("gpu")},
				"uuid":        {StringValue: ptr.To(dev.UUID)},
				"productName": {StringValue: ptr.To(dev.Name)},
			},
			Capacity: memory(dev.MemoryTotalMiB),
			Taints:   deviceTaints(taints, dev.UUID),
		})
		if !migEnabled(dev) {
			continue
		}
		for _, mig := range dev.MigInstances {
			devices = append(devices, resourceapi.Device{
				Name: migDeviceName(dev.Index, mig.Profile, mig.Placement.Start),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"type":        {StringValue: ptr.To("mig")},
					"uuid":        {StringValue: ptr.To(mig.UUID)},
					"parentUUID":  {StringValue: ptr.To(dev.UUID)},
					"profile":     {StringValue: ptr.To(mig.Profile)},
					"productName": {StringValue: ptr.To(dev.Name)},
				},
				Capacity: memory(mig.MemoryMiB),
				Taints:   deviceTaints(taints, mig.UUID),
			})
		}
	}
	return devices
}

// readTaints reads the --taints file; no path: no taints.
func readTaints(path string) (map[string][]taint, error) {
	out := map[string][]taint{}
	if path == "" {
		return out, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the node's identity")
	node := flag.String("node", "", "node name")
	driverName := flag.String("driver", "gpu.nvidia.com", "DRA driver name")
	nvmlPath := flag.String("nvml-config", "", "the fake NVML JSON configuration of this node")
	taintsPath := flag.String("taints", "", "optional JSON: device UUID -> [{key, value, effect}]")
	cdiDir := flag.String("cdi-dir", "", "where containerd reads CDI specs")
	registrarDir := flag.String("registrar-dir", "", "the kubelet's plugins_registry directory")
	pluginDir := flag.String("plugin-dir", "", "this plugin's directory below the kubelet's plugins directory")
	klog.InitFlags(nil)
	flag.Parse()
	logger := klog.Background()

	raw, err := os.ReadFile(*nvmlPath)
	if err != nil {
		logger.Error(err, "read the NVML configuration")
		os.Exit(1)
	}
	var config nvmlConfig
	if err := json.Unmarshal(raw, &config); err != nil {
		logger.Error(err, "parse the NVML configuration", "path", *nvmlPath)
		os.Exit(1)
	}
	taints, err := readTaints(*taintsPath)
	if err != nil {
		logger.Error(err, "read the taints")
		os.Exit(1)
	}
	rest, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		logger.Error(err, "kubeconfig")
		os.Exit(1)
	}
	client, err := kubernetes.NewForConfig(rest)
	if err != nil {
		logger.Error(err, "client")
		os.Exit(1)
	}
	for _, dir := range []string{*cdiDir, *registrarDir, *pluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			logger.Error(err, "mkdir", "path", dir)
			os.Exit(1)
		}
	}
	d := &driver{
		name:    *driverName,
		cdiDir:  *cdiDir,
		cdiKind: "gpuplace.io/gpu",
		byName:  map[string]string{},
	}
	published := slices(config, taints)
	for _, dev := range published {
		d.byName[dev.Name] = *dev.Attributes["uuid"].StringValue
	}

	ctx, cancel := signal.NotifyContext(klog.NewContext(context.Background(), logger), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*node),
		kubeletplugin.DriverName(*driverName),
		kubeletplugin.RegistrarDirectoryPath(*registrarDir),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir),
	)
	if err != nil {
		logger.Error(err, "start the kubelet plugin")
		os.Exit(1)
	}
	defer helper.Stop()
	resources := resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			*node: {Slices: []resourceslice.Slice{{Devices: published}}},
		},
	}
	if err := helper.PublishResources(ctx, resources); err != nil {
		logger.Error(err, "publish ResourceSlices")
		os.Exit(1)
	}
	logger.Info("serving", "driver", *driverName, "node", *node, "devices", len(published))
	<-ctx.Done()
}
