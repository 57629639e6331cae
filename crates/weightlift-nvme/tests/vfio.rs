//! The VFIO backend on a machine without a drive bound to vfio-pci: a clear error naming what is missing and how to
//! bind a controller, never a panic.

use weightlift_nvme::NvmeError;
use weightlift_nvme::vfio::{VfioBus, nvme_controllers};

#[test]
fn without_a_bound_controller_the_error_says_how_to_bind_one() {
    let present = nvme_controllers();
    if present.iter().any(|c| c.driver.as_deref() == Some("vfio-pci")) {
        println!("skipped: an NVMe controller is bound to vfio-pci here ({present:?}); this test needs none");
        return;
    }
    let e = VfioBus::open(None).unwrap_err();
    assert!(matches!(e, NvmeError::NoVfioDevice { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("no NVMe controller bound to vfio-pci"), "{msg}");
    assert!(
        msg.contains("driver_override") && msg.contains("drivers_probe") && msg.contains("modprobe vfio-pci"),
        "{msg}"
    );
    assert!(msg.contains("IOMMU"), "{msg}");
    println!("{msg}");

    let e = VfioBus::open(Some("0000:ff:1f.7")).unwrap_err();
    assert!(e.to_string().contains("0000:ff:1f.7"), "{e}");
    if let Some(c) = present.first() {
        // A controller that exists but is bound to another driver gets the binding instructions for it.
        let e = VfioBus::open(Some(&c.address)).unwrap_err();
        assert!(e.to_string().contains(&c.address), "{e}");
    }
}
