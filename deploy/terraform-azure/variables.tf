variable "name_prefix" {
  type        = string
  description = "Prefix of every resource name, e.g. \"ppfs-prod\". Lower-case letters, digits and hyphens."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,18}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix must be 3-20 characters of a-z, 0-9 and '-', starting with a letter and not ending with '-'."
  }
}

variable "location" {
  type        = string
  description = "Azure region of every resource, e.g. \"westeurope\"."

  validation {
    condition     = can(regex("^[a-z0-9]+$", var.location))
    error_message = "location must be an Azure region name such as \"westeurope\" (lower case, no spaces)."
  }
}

variable "resource_group_name" {
  type        = string
  description = "Existing resource group to deploy into."

  validation {
    condition     = length(var.resource_group_name) > 0 && length(var.resource_group_name) <= 90
    error_message = "resource_group_name must name an existing resource group (1-90 characters)."
  }
}

variable "party_count" {
  type        = number
  description = "Number of computing parties: 3 (Alice, Bob, Carol) or 4 (adds Dave). Each party gets its own VM; the gateway gets one more."
  default     = 3

  validation {
    condition     = contains([3, 4], var.party_count)
    error_message = "party_count must be 3 or 4."
  }
}

variable "security" {
  type        = string
  description = "Security setting the deployment runs: passive-3pc or active-3pc with 3 parties, active-4pc with 4."
  default     = "passive-3pc"

  validation {
    condition     = contains(["passive-3pc", "active-3pc", "active-4pc"], var.security)
    error_message = "security must be passive-3pc, active-3pc or active-4pc."
  }

  validation {
    condition     = (var.security == "active-4pc") == (var.party_count == 4)
    error_message = "active-4pc needs party_count = 4; passive-3pc and active-3pc need party_count = 3."
  }
}

variable "address_space" {
  type        = string
  description = "Address space of the VNet (IPv4 CIDR)."
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.address_space, 0)) && !strcontains(var.address_space, ":")
    error_message = "address_space must be an IPv4 CIDR such as 10.42.0.0/16."
  }
}

variable "party_subnet_prefix" {
  type        = string
  description = "Subnet of the party VMs (inside address_space). Party i gets the private IP cidrhost(prefix, 10 + i)."
  default     = "10.42.1.0/24"

  validation {
    condition     = can(cidrhost(var.party_subnet_prefix, 16))
    error_message = "party_subnet_prefix must be an IPv4 CIDR with room for at least 16 hosts, such as 10.42.1.0/24."
  }
}

variable "gateway_subnet_prefix" {
  type        = string
  description = "Subnet of the gateway VM (inside address_space). The gateway gets cidrhost(prefix, 10)."
  default     = "10.42.2.0/24"

  validation {
    condition     = can(cidrhost(var.gateway_subnet_prefix, 16))
    error_message = "gateway_subnet_prefix must be an IPv4 CIDR with room for at least 16 hosts, such as 10.42.2.0/24."
  }
}

variable "allowed_https_cidrs" {
  type        = list(string)
  description = "Client networks (data owners, analysts) allowed to reach the gateway's HTTPS port. Nothing else reaches the gateway."

  validation {
    condition     = length(var.allowed_https_cidrs) > 0 && alltrue([for c in var.allowed_https_cidrs : can(cidrhost(c, 0))])
    error_message = "allowed_https_cidrs must list at least one CIDR such as 203.0.113.0/24."
  }

  validation {
    # by prefix length, not spelling: 0.0.0.0/00 or a /0 typo such as 203.0.113.0/0 is
    # the whole Internet too
    condition     = alltrue([for c in var.allowed_https_cidrs : try(tonumber(split("/", c)[1]) >= 8, true)])
    error_message = "allowed_https_cidrs must not contain 0.0.0.0/0 or any prefix shorter than /8: list the client networks instead."
  }
}

variable "ssh_allowed_cidrs" {
  type        = list(string)
  description = "Networks allowed to SSH to the VMs (administration). Empty: no SSH rule (use Azure Bastion or serial console)."
  default     = []

  validation {
    condition     = alltrue([for c in var.ssh_allowed_cidrs : can(cidrhost(c, 0)) && try(tonumber(split("/", c)[1]) >= 8, false)])
    error_message = "ssh_allowed_cidrs must be CIDRs with a prefix of /8 or longer (never 0.0.0.0/0)."
  }
}

variable "admin_username" {
  type        = string
  description = "Administrator user of the VMs (SSH key login only)."
  default     = "ppfsadmin"

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.admin_username)) && !contains(["admin", "root", "administrator"], var.admin_username)
    error_message = "admin_username must be a Linux user name (a-z, 0-9, '_', '-') other than admin, root or administrator."
  }
}

variable "admin_ssh_public_key" {
  type        = string
  description = "OpenSSH PUBLIC key of the administrator. Only the public key is passed; no key is generated into the state."

  validation {
    condition     = can(regex("^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp256) [A-Za-z0-9+/=]+", var.admin_ssh_public_key))
    error_message = "admin_ssh_public_key must be an OpenSSH public key line (ssh-ed25519 AAAA...)."
  }
}

variable "party_admin_ssh_public_keys" {
  type        = map(string)
  description = "Each party VM's own administrator: an OpenSSH PUBLIC key per party name (alice, bob, carol, dave). Whoever logs in to a party's VM can read that party's private keys, so where the parties are run by different people give each its own; a party not listed takes admin_ssh_public_key. The gateway's VM accepts these keys too, as SSH to a party jumps through it."
  default     = {}

  validation {
    condition     = alltrue([for name in keys(var.party_admin_ssh_public_keys) : contains(["alice", "bob", "carol", "dave"], name)])
    error_message = "party_admin_ssh_public_keys is keyed by party name: alice, bob, carol or dave."
  }

  validation {
    condition     = alltrue([for key in values(var.party_admin_ssh_public_keys) : can(regex("^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp256) [A-Za-z0-9+/=]+", key))])
    error_message = "Each of party_admin_ssh_public_keys must be an OpenSSH public key line (ssh-ed25519 AAAA...)."
  }
}

variable "party_vm_size" {
  type        = string
  description = "VM size of each party (MPC is CPU and network bound)."
  default     = "Standard_D4s_v5"

  validation {
    condition     = can(regex("^Standard_", var.party_vm_size))
    error_message = "party_vm_size must be an Azure VM size such as Standard_D4s_v5."
  }
}

variable "gateway_vm_size" {
  type        = string
  description = "VM size of the gateway."
  default     = "Standard_B2s"

  validation {
    condition     = can(regex("^Standard_", var.gateway_vm_size))
    error_message = "gateway_vm_size must be an Azure VM size such as Standard_B2s."
  }
}

variable "party_image" {
  type        = string
  description = "Container image of the party daemon, e.g. myregistry.azurecr.io/ppfs-party:0.1.0 (services/party/Dockerfile)."

  validation {
    condition     = can(regex("^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$", var.party_image))
    error_message = "party_image must be a registry reference with a tag or digest, e.g. myregistry.azurecr.io/ppfs-party:0.1.0."
  }
}

variable "gateway_image" {
  type        = string
  description = "Container image of the dealer-gateway, e.g. myregistry.azurecr.io/ppfs-gateway:0.1.0."

  validation {
    condition     = can(regex("^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$", var.gateway_image))
    error_message = "gateway_image must be a registry reference with a tag or digest, e.g. myregistry.azurecr.io/ppfs-gateway:0.1.0."
  }
}

variable "acr_id" {
  type        = string
  description = "Resource ID of the Azure Container Registry holding the images; the VMs get AcrPull on it and log in with their managed identity. null: the images are pulled without credentials."
  default     = null

  validation {
    condition     = var.acr_id == null || can(regex("^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.ContainerRegistry/registries/[^/]+$", var.acr_id))
    error_message = "acr_id must be a container registry resource ID (/subscriptions/.../providers/Microsoft.ContainerRegistry/registries/NAME) or null."
  }
}

variable "key_vault_id" {
  type        = string
  description = "Resource ID of an existing Key Vault (RBAC authorisation) holding one secret per VM: <secret_prefix>-alice, -bob, -carol, (-dave), -gateway. Each holds the base64 of a tar.gz of that role's folder from `ppfs pki init`. Terraform never reads the values."

  validation {
    condition     = can(regex("^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.KeyVault/vaults/[A-Za-z0-9-]{3,24}$", var.key_vault_id))
    error_message = "key_vault_id must be a Key Vault resource ID (/subscriptions/.../providers/Microsoft.KeyVault/vaults/NAME)."
  }
}

variable "secret_prefix" {
  type        = string
  description = "Prefix of the Key Vault secret names (see key_vault_id)."
  default     = "ppfs"

  validation {
    condition     = can(regex("^[A-Za-z0-9-]{1,40}$", var.secret_prefix))
    error_message = "secret_prefix must be 1-40 characters of letters, digits and '-' (Key Vault secret name rules)."
  }
}

variable "mpc_port_base" {
  type        = number
  description = "First MPC port of party 0; party i uses mpc_ports_per_party ports from mpc_port_base + i * mpc_ports_per_party (bound 1:1 on the VM)."
  default     = 14000

  validation {
    condition     = var.mpc_port_base >= 1024 && var.mpc_port_base <= 65000
    error_message = "mpc_port_base must be between 1024 and 65000."
  }
}

variable "mpc_ports_per_party" {
  type        = number
  description = "MPC ports per party: the gateway gives each job the next one, so consecutive jobs never share an engine port."
  default     = 4

  validation {
    condition     = var.mpc_ports_per_party >= 1 && var.mpc_ports_per_party <= 64
    error_message = "mpc_ports_per_party must be between 1 and 64."
  }
}

variable "grpc_port" {
  type        = number
  description = "Port of each party's gRPC control plane (reachable from the gateway only)."
  default     = 50051

  validation {
    condition     = var.grpc_port >= 1024 && var.grpc_port <= 65535
    error_message = "grpc_port must be between 1024 and 65535."
  }
}

variable "gateway_https_port" {
  type        = number
  description = "HTTPS port of the gateway (reachable from allowed_https_cidrs only)."
  default     = 443

  validation {
    condition     = var.gateway_https_port == 443 || (var.gateway_https_port >= 1024 && var.gateway_https_port <= 65535)
    error_message = "gateway_https_port must be 443 or between 1024 and 65535."
  }
}

variable "gateway_dns_label" {
  type        = string
  description = "DNS label of the gateway's public IP: <label>.<location>.cloudapp.azure.com (unique per region). null: name_prefix."
  default     = null

  validation {
    condition     = var.gateway_dns_label == null || can(regex("^[a-z][a-z0-9-]{1,61}[a-z0-9]$", var.gateway_dns_label))
    error_message = "gateway_dns_label must be 3-63 characters of a-z, 0-9 and '-', starting with a letter."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags set on every resource."
  default     = {}
}
