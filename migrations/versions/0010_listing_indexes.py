"""listing_indexes: a station's jobs and batches by (created_at, id), the order its lists page in

Revision ID: 0010_listing_indexes
Revises: 0009_batch_sealed
"""
from alembic import op

revision = '0010_listing_indexes'
down_revision = '0009_batch_sealed'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_jobs_station_id_created_at', 'jobs', ['station_id', 'created_at', 'id'], unique=False)
    op.create_index('ix_batches_station_id_created_at', 'batches', ['station_id', 'created_at', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_batches_station_id_created_at', table_name='batches')
    op.drop_index('ix_jobs_station_id_created_at', table_name='jobs')
