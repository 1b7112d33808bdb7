//! Which volumes an installation is given (`--storage-class`, `--csi-driver`), for both loops.

use k8s_openapi::api::core::v1::PersistentVolume;

/// Optional filters on which volumes are ours (`--storage-class`, `--csi-driver`).
#[derive(Clone, Debug, Default)]
pub struct Filters {
    pub storage_classes: Vec<String>,
    pub csi_drivers: Vec<String>,
}

impl Filters {
    /// Whether a storage class passes (no filter: any).
    pub fn admit_class(&self, class: &str) -> bool {
        self.storage_classes.is_empty() || self.storage_classes.iter().any(|c| c == class)
    }

    /// Whether a CSI driver passes (no filter: any).
    pub fn admit_driver(&self, driver: &str) -> bool {
        self.csi_drivers.is_empty() || self.csi_drivers.iter().any(|d| d == driver)
    }

    /// Whether a PV's own storage class and CSI driver pass.
    pub fn admit_pv(&self, pv: &PersistentVolume) -> bool {
        let spec = pv.spec.as_ref();
        let class = spec.and_then(|s| s.storage_class_name.as_deref()).unwrap_or("");
        let driver = spec.and_then(|s| s.csi.as_ref()).map_or("", |c| c.driver.as_str());
        self.admit_class(class) && self.admit_driver(driver)
    }
}
